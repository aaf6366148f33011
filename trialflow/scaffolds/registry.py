"""Scaffold registry: name -> "module:Class", imported lazily on first use.

Lazy so that importing the registry never pulls in a scaffold's dependencies (and a broken
scaffold module breaks only its own name). `get_scaffold("nope")` raises `UnknownScaffold`
(a KeyError) listing every registered name.

A name that is not registered but looks like an import path, ``"my_pkg.my_mod:MyScaffold"``,
names a `Scaffold` subclass directly (custom scaffolds without registration; the module
must be importable by the client that submits AND by the workers). It raises
`UnknownScaffold` when the module or class cannot be imported, or the class is not a
`Scaffold`, saying why. `check_scaffold(name, options)` builds the scaffold once with its
options, so that a bad name or option fails before any trial is submitted.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterable
from typing import Any

from proxy.registry import Registry
from trialflow.errors import UnknownScaffold
from trialflow.scaffolds.base import Scaffold

_REGISTRY: Registry[type[Scaffold]] = Registry(
    "scaffold",
    {
        "oracle": "trialflow.scaffolds.oracle:OracleScaffold",
        "nop": "trialflow.scaffolds.nop:NopScaffold",
        "claude-code": "trialflow.scaffolds.claude_code:ClaudeCodeScaffold",
        "opencode": "trialflow.scaffolds.opencode:OpenCodeScaffold",
        "codex": "trialflow.scaffolds.codex:CodexScaffold",
        "mini-swe-agent": "trialflow.scaffolds.mini_swe_agent:MiniSweAgentScaffold",
        "openhands": "trialflow.scaffolds.openhands:OpenHandsScaffold",
        "terminus": "trialflow.scaffolds.terminus:TerminusScaffold",
    },
)


def available_scaffolds() -> list[str]:
    return _REGISTRY.names()


def register_scaffold(name: str, target: str) -> None:
    """Register (or replace) `name` -> "module:Class"."""
    _REGISTRY.register(name, target)


def is_import_path(name: str) -> bool:
    """True for ``"module.path:ClassName"`` (the form of a custom scaffold)."""
    module, sep, cls_name = name.partition(":")
    return bool(
        sep and module and cls_name.isidentifier() and all(p.isidentifier() for p in module.split("."))
    )


def scaffold_class(name: str) -> type[Scaffold]:
    if name in _REGISTRY:
        return _checked(_REGISTRY.get(name), name, registered=True)
    if is_import_path(name):
        return _load(name, registered=False)
    raise UnknownScaffold(
        f"unknown scaffold {name!r}; available: {', '.join(available_scaffolds())}, "
        "or an import path 'my_pkg.my_mod:MyScaffold'"
    )


def _load(target: str, *, registered: bool) -> type[Scaffold]:
    module, _, cls_name = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError) as err:
        raise UnknownScaffold(f"cannot load scaffold {target!r}: {type(err).__name__}: {err}") from None
    return _checked(cls, target, registered=registered)


def _checked(cls: Any, target: str, *, registered: bool) -> type[Scaffold]:
    """`cls` if it is a Scaffold subclass. A registered name's broken import (a bug, not a
    user's typo) propagates from the registry itself."""
    if not (isinstance(cls, type) and issubclass(cls, Scaffold)):
        if registered:
            raise TypeError(f"{target} is not a Scaffold subclass")
        raise UnknownScaffold(f"scaffold {target!r} is not a trialflow.scaffolds.Scaffold subclass")
    return cls


def get_scaffold(name: str, **options: Any) -> Scaffold:
    """A new instance of the scaffold `name` (registered, or an import path); options go to
    its constructor."""
    return scaffold_class(name)(**options)


def check_scaffold(name: str, options: dict[str, Any] | None = None) -> Scaffold:
    """The scaffold built with `options`, or `UnknownScaffold` naming what is wrong (unknown
    name, unimportable path, options its constructor does not take or rejects)."""
    cls = scaffold_class(name)
    try:
        return cls(**(options or {}))
    except (TypeError, ValueError) as err:
        raise UnknownScaffold(f"scaffold {name!r} does not take options {options!r}: {err}") from None


def parse_scaffold_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``["max_turns=5", "model_kwargs={\"temperature\": 0.2}", "mode=fast"]`` -> options:
    each VALUE is JSON when it parses, else the plain string. `ValueError` for a pair
    without ``=`` or with an empty key."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"scaffold option {pair!r} is not KEY=VALUE")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out
