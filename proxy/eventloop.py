"""The event loop the proxy's processes run on: uvloop where installed, else asyncio's.

uvloop (libuv) cuts the proxy's socket and scheduling overhead per turn by about a third
against the default selector loop (bench/proxy_overhead.py measures both through
``TRIALFLOW_EVENT_LOOP``). ``TRIALFLOW_EVENT_LOOP=asyncio`` forces the stdlib loop, e.g. to
rule the loop out while debugging; any other value than ``uvloop``/``asyncio``/unset is an
error, so a typo does not silently change what is measured.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "TRIALFLOW_EVENT_LOOP"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop constructor to use (None = asyncio's default)."""
    choice = os.environ.get(ENV, "").strip().lower()
    if choice not in ("", "uvloop", "asyncio"):
        raise ValueError(f"{ENV} must be 'uvloop' or 'asyncio', not {choice!r}")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop ``loop_factory`` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
