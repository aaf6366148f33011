"""Waiting on a condition instead of sleeping a fixed time and assuming it holds by then."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def wait_until(condition: Callable[[], object], timeout_s: float = 30.0, what: str = "") -> None:
    """Return as soon as ``condition()`` is true (checked every 10 ms); ``AssertionError``
    naming ``what`` if it is still false after ``timeout_s``. The timeout is a bound for a
    loaded machine, not an expected duration."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what or condition}")
        await asyncio.sleep(0.01)
