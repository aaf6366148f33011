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

Both limits are the ceiling (`max_concurrent_trials`) in the fixed mode. Given a `Policy`,
`run` ticks the controller (trialflow.admission._control) every interval with what the
`Sensors` read and what the gates hold, and moves the limits below the ceiling; each
decision is in the metrics (limits, binding signal, the signals' values), in `report()`
(the store's ``admission/{worker}.json``, `trialflow status`), and a log line says when the
binding side changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict

from temporalio.worker import FixedSizeSlotSupplier, WorkerTuner

from trialflow.admission._control import Policy, Signals, State, Usage, step
from trialflow.admission._gate import Gate, SandboxSlots
from trialflow.admission._report import AdmissionReport
from trialflow.admission._signals import Sensors, StartStats
from trialflow.metrics import TrialMetrics

log = logging.getLogger("trialflow.admission")


class Admission:
    """`policy` None: the fixed mode (both limits at `ceiling`); else the controller's."""

    def __init__(
        self, ceiling: int, metrics: TrialMetrics | None = None, policy: Policy | None = None
    ) -> None:
        if policy is not None and policy.ceiling != ceiling:
            raise ValueError(f"the policy's ceiling {policy.ceiling} is not the ceiling {ceiling}")
        self.ceiling = ceiling
        self.policy = policy
        self.state = State.initial(policy) if policy is not None else None
        self.signals = Signals()
        self.starts = StartStats()
        start = self.state.sandbox_limit if self.state is not None else ceiling
        self.sandboxes = Gate(start)
        self.model = Gate(self.state.model_limit if self.state is not None else ceiling)
        self._slots = SandboxSlots(self.sandboxes)
        self._metrics = metrics if metrics is not None else TrialMetrics()
        self._leases: set[str] = set()
        self._publish()

    # -- the sandbox gate -----------------------------------------------------------------
    def tuner(self) -> WorkerTuner:
        """The set-up worker's tuner: its activity slots come from the sandbox gate (it
        runs no workflows or local activities; those suppliers are nominal)."""
        return WorkerTuner.create_composite(
            workflow_supplier=FixedSizeSlotSupplier(1),
            activity_supplier=self._slots,
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

    def usage(self) -> Usage:
        """What the gates hold: set-ups running + live sandboxes (not the idle pollers'
        reservations), and model phases."""
        sandboxes = self._slots.used + len(self._leases)
        return Usage(
            sandboxes=sandboxes,
            sandbox_waiting=sandboxes >= self.sandboxes.limit,
            model=self.model.held,
            model_waiting=self.model.waiting,
        )

    def tick(self, signals: Signals) -> State | None:
        """One controller decision from `signals` (None in the fixed mode), applied."""
        if self.policy is None or self.state is None:
            return None
        before = self.state.binding
        self.signals = signals
        self.state = state = step(self.policy, self.state, signals, self.usage())
        self.set_limits(state.sandbox_limit, state.model_limit)
        if state.binding.side != before.side:
            log.info(
                "admission: %s binds now (was %s): %d sandboxes, %d model phases",
                state.binding,
                before,
                state.sandbox_limit,
                state.model_limit,
            )
        self._metrics.admission_binding.clear()
        self._metrics.admission_binding.labels(state.binding.side, state.binding.signal).set(1)
        for name, value in _signal_values(signals).items():
            self._metrics.admission_signal.labels(name).set(value)
        return state

    async def run(
        self, sensors: Sensors, interval_s: float, on_tick: Callable[[], None] | None = None
    ) -> None:
        """Tick every `interval_s` until cancelled. A failing read is logged and skipped:
        the limits then stay where they are (never a reason to stop the worker)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.tick(await sensors.read())
            except (OSError, ValueError, RuntimeError) as exc:
                log.warning("admission: signals not read (%s: %s); limits unchanged", type(exc).__name__, exc)
            if on_tick is not None:
                on_tick()

    def report(self, worker_id: str) -> AdmissionReport:
        usage = self.usage()
        binding = self.state.binding if self.state is not None else None
        return AdmissionReport(
            worker_id=worker_id,
            mode="fixed" if self.policy is None else "adaptive",
            ceiling=self.ceiling,
            sandbox_limit=self.sandboxes.limit,
            model_limit=self.model.limit,
            live_sandboxes=len(self._leases),
            sandboxes_in_use=usage.sandboxes,
            model_phase=usage.model,
            model_waiting=usage.model_waiting,
            binding=str(binding) if binding is not None else "ceiling:max_concurrent_trials",
            signals=_signal_values(self.signals),
        )

    def _publish(self) -> None:
        m = self._metrics
        for kind, gate in (("sandboxes", self.sandboxes), ("model_phase", self.model)):
            m.admission_limit.labels(kind).set(gate.limit)
            m.admission_held.labels(kind).set(gate.held)
            m.admission_waiting.labels(kind).set(gate.waiting)
        m.admission_live_sandboxes.set(len(self._leases))


def _signal_values(signals: Signals) -> dict[str, float]:
    """The signals that were read, flat (metric label / report key -> value)."""
    out = {f"sandbox_{k}": v for k, v in asdict(signals.sandbox).items() if v is not None}
    if signals.replica is not None:
        out.update({f"replica_{k}": float(v) for k, v in asdict(signals.replica).items()})
    return out
