"""Gate: a counting limit whose size changes while it is held; and the Temporal slot supplier
that makes the set-up queue poll only while the host has room for one more live sandbox.

A `Gate` hands out units while ``held < limit``. Lowering the limit never takes a unit back
(admission never cancels a trial to shed load): new acquirers wait until enough holders
have released. Waiters are served first come, first served. It is safe to call from any
thread: Temporal's core calls a slot supplier's ``release_slot`` and ``mark_slot_used``
from its own threads, so waiters are woken through their event loop's
``call_soon_threadsafe``.

`SandboxSlots` is a temporalio ``CustomSlotSupplier`` for the set-up worker: a set-up task is
polled only after it reserved a unit of the sandbox gate, so a set-up that would exceed the
live-sandbox cap stays in Temporal's queue (queued, for this or any other worker with room;
the set-up activity has no schedule-to-start timeout) instead of creating a sandbox whose
later activities then wait on a busy host queue. When the set-up made a sandbox, the
activity takes a lease (`Gate.force_acquire`) before its slot is released, so the count
never drops between the set-up's end and the sandbox's teardown (`Gate.release` then).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

from temporalio.worker import (
    CustomSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
)


class Gate:
    """``limit`` units; `acquire` waits while ``held >= limit``. ``limit`` >= 1 always (a
    gate at 0 could never admit the trial that shows a side has recovered)."""

    def __init__(self, limit: int) -> None:
        self._lock = threading.Lock()
        self._limit = max(1, int(limit))
        self._held = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        """Acquirers waiting now."""
        return len(self._waiters)

    def set_limit(self, limit: int) -> None:
        with self._lock:
            self._limit = max(1, int(limit))
            self._wake()

    def try_acquire(self) -> bool:
        """A unit now, or False; never waits (and never jumps the queue of waiters)."""
        with self._lock:
            if self._held < self._limit and not self._waiters:
                self._held += 1
                return True
            return False

    def force_acquire(self) -> None:
        """Count a unit that already exists whatever the limit (a sandbox made by a set-up
        whose own unit is about to be released)."""
        with self._lock:
            self._held += 1

    async def acquire(self) -> None:
        """Wait for a unit. Cancellable: a cancelled waiter holds no unit afterwards."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._held < self._limit and not self._waiters:
                self._held += 1
                return
            future: asyncio.Future[None] = loop.create_future()
            entry = (loop, future)
            self._waiters.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            with self._lock:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                else:  # granted (and counted) before the cancellation arrived: give it back
                    self._held = max(0, self._held - 1)
                    self._wake()
            raise

    def release(self) -> None:
        with self._lock:
            self._held = max(0, self._held - 1)
            self._wake()

    def _wake(self) -> None:
        """Grant the free units to the oldest waiters (under the lock): each unit is
        counted here, on the waiter's behalf, so no later acquirer can take it first."""
        while self._held < self._limit and self._waiters:
            loop, future = self._waiters.popleft()
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that waiter's loop is closed: nobody to hand the unit to
                continue
            self._held += 1


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Permit(SlotPermit):
    used = False


class SandboxSlots(CustomSlotSupplier):
    """The set-up worker's activity slots, one unit of `gate` each (module docstring).
    ``used``: slots running a set-up now (the rest are reserved by idle pollers)."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._lock = threading.Lock()
        self.used = 0

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        await self.gate.acquire()
        return _Permit()

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        return _Permit() if self.gate.try_acquire() else None

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        if isinstance(ctx.permit, _Permit) and not ctx.permit.used:
            with self._lock:
                ctx.permit.used = True
                self.used += 1

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        if isinstance(ctx.permit, _Permit) and ctx.permit.used:
            with self._lock:
                ctx.permit.used = False
                self.used -= 1
        self.gate.release()
