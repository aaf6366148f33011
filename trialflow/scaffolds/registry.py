"""Scaffold registry: name -> "module:Class", imported lazily on first use.

Lazy so that importing the registry never pulls in a scaffold's dependencies (and a broken
scaffold module breaks only its own name). `get_scaffold("nope")` raises `UnknownScaffold`
(a KeyError) listing every registered name.
"""

from __future__ import annotations

import importlib
from typing import Any

from trialflow.errors import UnknownScaffold
from trialflow.scaffolds.base import Scaffold

_REGISTRY: dict[str, str] = {
    "oracle": "trialflow.scaffolds.oracle:OracleScaffold",
    "nop": "trialflow.scaffolds.nop:NopScaffold",
    "claude-code": "trialflow.scaffolds.claude_code:ClaudeCodeScaffold",
    "opencode": "trialflow.scaffolds.opencode:OpenCodeScaffold",
    "codex": "trialflow.scaffolds.codex:CodexScaffold",
    "terminus": "trialflow.scaffolds.terminus:TerminusScaffold",
}


def available_scaffolds() -> list[str]:
    return sorted(_REGISTRY)


def register_scaffold(name: str, target: str) -> None:
    """Register (or replace) `name` -> "module:Class"."""
    if ":" not in target:
        raise ValueError(f"scaffold target must look like 'module:Class', got {target!r}")
    _REGISTRY[name] = target


def scaffold_class(name: str) -> type[Scaffold]:
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise UnknownScaffold(
            f"unknown scaffold {name!r}; available: {', '.join(available_scaffolds())}"
        ) from None
    module, _, cls_name = target.partition(":")
    cls = getattr(importlib.import_module(module), cls_name)
    if not (isinstance(cls, type) and issubclass(cls, Scaffold)):
        raise TypeError(f"{target} is not a Scaffold subclass")
    return cls


def get_scaffold(name: str, **options: Any) -> Scaffold:
    """A new instance of the scaffold registered as `name` (options go to its constructor)."""
    return scaffold_class(name)(**options)
