"""Sandbox backend registry: name -> "module:Class" of a `SandboxBackend`, imported lazily.

The worker process runs the backend its settings name (`sandbox_backend`, default "docker";
`open_backend`), so a new backend (a Kubernetes one) is a class and a registration, not an
edit of the worker. Plugins register by import path through the `extra_sandbox_backends`
setting (name -> "my_pkg.my_mod:MyBackend"), like `extra_scaffolds`. Lazy, so that naming
the registry never imports a backend's client library (the Docker SDK, a Kubernetes client).

A name that is not registered, a target that cannot be imported, and a class that is not a
`SandboxBackend` raise `UnknownSandboxBackend` (a KeyError) saying which, with the names
available: a worker started with a typo fails at once, in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from proxy.registry import Registry
from trialflow.errors import UnknownSandboxBackend
from trialflow.sandbox.base import SandboxBackend

if TYPE_CHECKING:
    from trialflow.settings import TrialflowSettings

_REGISTRY: Registry[type[SandboxBackend]] = Registry(
    "sandbox backend", {"docker": "trialflow.sandbox.docker:DockerBackend"}
)


def available_backends() -> list[str]:
    return _REGISTRY.names()


def register_backend(name: str, target: str) -> None:
    """Register (or replace) `name` -> "module:Class"."""
    _REGISTRY.register(name, target)


def backend_class(name: str) -> type[SandboxBackend]:
    """The backend class registered under `name`; `UnknownSandboxBackend` otherwise."""
    if name not in _REGISTRY:
        raise UnknownSandboxBackend(
            f"unknown sandbox backend {name!r}; available: {', '.join(available_backends())}"
        )
    try:
        cls = _REGISTRY.get(name)
    except (ImportError, AttributeError) as err:
        raise UnknownSandboxBackend(
            f"cannot load sandbox backend {name!r}: {type(err).__name__}: {err}"
        ) from None
    if not (isinstance(cls, type) and issubclass(cls, SandboxBackend)):
        raise UnknownSandboxBackend(
            f"sandbox backend {name!r} is not a trialflow.sandbox.SandboxBackend subclass"
        )
    return cls


def check_backend(settings: TrialflowSettings) -> type[SandboxBackend]:
    """The class `settings.sandbox_backend` names, after registering the settings' plugins
    (`extra_sandbox_backends`); `UnknownSandboxBackend` before anything starts."""
    for name, target in settings.extra_sandbox_backends.items():
        register_backend(name, target)
    return backend_class(settings.sandbox_backend)


def open_backend(settings: TrialflowSettings, *, labels: Mapping[str, str]) -> SandboxBackend:
    """The backend `settings.sandbox_backend` names, built from the settings, with `labels`
    on everything it creates (`SandboxBackend.from_settings`)."""
    return check_backend(settings).from_settings(settings, labels=labels)
