"""Agent scaffolds: the `Scaffold` ABC (lifecycle in `base`), a lazy registry and the
built-in `oracle` and `nop` scaffolds. claude-code, opencode and terminus live in their own
modules and are imported only when asked for."""

from trialflow.scaffolds.base import Scaffold, ScaffoldContext, ScaffoldResult
from trialflow.scaffolds.registry import (
    available_scaffolds,
    check_scaffold,
    get_scaffold,
    register_scaffold,
    scaffold_class,
)

__all__ = [
    "Scaffold",
    "ScaffoldContext",
    "ScaffoldResult",
    "available_scaffolds",
    "check_scaffold",
    "get_scaffold",
    "register_scaffold",
    "scaffold_class",
]
