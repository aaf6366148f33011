"""A generic name -> implementation registry with lazy imports (the parsers' and the
scaffolds' registries are both instances).

Entries are ``"package.module:Attribute"`` strings, imported on first ``get``, so registering a
parser (or scaffold) costs nothing until it is used. Unknown names raise ``KeyError`` listing
the names that are available.
"""

from __future__ import annotations

import importlib
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """``kind`` names what is registered (used in error messages only)."""

    def __init__(self, kind: str, entries: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._targets: dict[str, str] = dict(entries or {})
        self._loaded: dict[str, T] = {}

    def register(self, name: str, target: str) -> None:
        """Add or replace ``name``; ``target`` is ``"module:Attribute"``."""
        if ":" not in target:
            raise ValueError(f"target must look like 'module:Attribute', got {target!r}")
        self._targets[name] = target
        self._loaded.pop(name, None)

    def names(self) -> list[str]:
        return sorted(self._targets)

    def __contains__(self, name: object) -> bool:
        return name in self._targets

    def get(self, name: str) -> T:
        """The registered object; ``KeyError`` (listing available names) for unknown names."""
        if name not in self._loaded:
            try:
                target = self._targets[name]
            except KeyError:
                raise KeyError(
                    f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}"
                ) from None
            module, _, attr = target.partition(":")
            self._loaded[name] = getattr(importlib.import_module(module), attr)
        return self._loaded[name]
