"""Admission: one worker's two gates and the leases that tie live sandboxes to them.

- ``sandboxes``: units = set-up slots reserved + live sandboxes (leases). The set-up worker's
  slot supplier (`slot_supplier`, `tuner`) reserves a unit before it polls a set-up task; a
  set-up that made a sandbox takes a lease (`lease`) before its slot goes back, the
  teardown ends it (`end_lease`). So the sandboxes alive on this host never exceed the
  gate's limit, and a trial beyond it waits as a set-up task in Temporal's queue.
- ``model``: units = trials in their model phase (a scaffold with a model session). The
  scaffold activity waits in `model_phase` before it opens its session, heartbeating, for
  at most the wait its own timeout leaves; past that it is admitted anyway and counted
  (``trialflow_admission_overadmitted_total``): a limit that binds too long must cost
  throughput, never an attempt.

Both limits start at the ceiling (`max_concurrent_trials`); `set_limits` (the controller,
trialflow.admission._control) moves them below it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from temporalio.worker import FixedSizeSlotSupplier, WorkerTuner

from trialflow.admission._gate import Gate, SandboxSlots
from trialflow.metrics import TrialMetrics

log = logging.getLogger("trialflow.admission")


class Admission:
    def __init__(self, ceiling: int, metrics: TrialMetrics | None = None) -> None:
        self.ceiling = ceiling
        self.sandboxes = Gate(ceiling)
        self.model = Gate(ceiling)
        self._metrics = metrics if metrics is not None else TrialMetrics()
        self._leases: set[str] = set()
        self._publish()

    # -- the sandbox gate -----------------------------------------------------------------
    def tuner(self) -> WorkerTuner:
        """The set-up worker's tuner: its activity slots come from the sandbox gate (it
        runs no workflows or local activities; those suppliers are nominal)."""
        return WorkerTuner.create_composite(
            workflow_supplier=FixedSizeSlotSupplier(1),
            activity_supplier=SandboxSlots(self.sandboxes),
            local_activity_supplier=FixedSizeSlotSupplier(1),
            nexus_supplier=FixedSizeSlotSupplier(1),
        )

    @property
    def live(self) -> int:
        """Sandboxes holding a lease (made here, not torn down yet)."""
        return len(self._leases)

    def lease(self, sandbox_id: str) -> None:
        """A set-up made `sandbox_id`: it holds a unit until `end_lease` (idempotent)."""
        if sandbox_id not in self._leases:
            self._leases.add(sandbox_id)
            self.sandboxes.force_acquire()
            self._publish()

    def end_lease(self, sandbox_id: str) -> None:
        """`sandbox_id` is gone (torn down, or found absent); unknown ids are ignored."""
        if sandbox_id in self._leases:
            self._leases.discard(sandbox_id)
            self.sandboxes.release()
            self._publish()

    # -- the model-phase gate -------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def model_phase(self, max_wait_s: float) -> AsyncIterator[float]:
        """Hold a model-phase unit for the block; yields the seconds waited. Waits at most
        `max_wait_s` (<= 0: not at all), then is admitted over the limit (module docstring)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._publish()
        try:
            async with asyncio.timeout(max(0.0, max_wait_s)):
                await self.model.acquire()
        except TimeoutError:
            self.model.force_acquire()
            self._metrics.admission_overadmitted.inc()
            log.warning("model phase admitted over its limit %d after %.0fs", self.model.limit, max_wait_s)
        waited = loop.time() - started
        self._metrics.admission_wait_seconds.labels("model_phase").observe(waited)
        self._publish()
        try:
            yield waited
        finally:
            self.model.release()
            self._publish()

    # -- limits ---------------------------------------------------------------------------
    def set_limits(self, sandboxes: int, model: int) -> None:
        """New working limits, clamped to [1, ceiling]. Holders keep their units."""
        self.sandboxes.set_limit(min(self.ceiling, sandboxes))
        self.model.set_limit(min(self.ceiling, model))
        self._publish()

    def _publish(self) -> None:
        m = self._metrics
        for kind, gate in (("sandboxes", self.sandboxes), ("model_phase", self.model)):
            m.admission_limit.labels(kind).set(gate.limit)
            m.admission_held.labels(kind).set(gate.held)
            m.admission_waiting.labels(kind).set(gate.waiting)
        m.admission_live_sandboxes.set(len(self._leases))
