"""Sandbox set-up and teardown activities.

`setup` runs on the shared queue (any worker); it builds/creates and starts the sandbox
on THIS worker's Docker engine and answers with this worker's host queue, where every
later activity of the attempt is scheduled. `teardown` runs on that host queue, or on the
shared queue as a fallback when the owning worker is gone: a worker on the same engine
(`SetupOutput.engine_id`) removes the container; elsewhere it removes nothing and says so
(`TeardownOutput.removed` False), and the sandbox is left to its host's lease.

With a `HostLease` (trialflow.fencing), `setup` first runs a lease round: a host that was
declared lost removes its fenced sandboxes and re-registers before it takes a new one, and
refuses (`HostFenced`, retried elsewhere) while it cannot reach the store to do so.
`lease_round` is the same round, run periodically by the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from temporalio import activity

from activities._support import heartbeat_interval, heartbeating, phase_network, typed_errors
from trialflow.admission import Admission
from trialflow.errors import HostFenced, SandboxLost, TaskInvalid
from trialflow.fencing import HeldSandbox, HostLease, LeaseRound
from trialflow.healthcheck import run_healthcheck
from trialflow.metrics import TrialMetrics
from trialflow.sandbox.base import ExecResult, Sandbox, SandboxBackend
from trialflow.sandbox.egress import Egresses
from trialflow.sandbox.network import PHASES, NetworkPolicyError, resolve_network
from trialflow.scaffolds import get_scaffold
from trialflow.storage import TrialKeys
from trialflow.tasks import Task, load_task
from workflows.shared import (
    RunNetwork,
    SetupInput,
    SetupOutput,
    StepPlan,
    TeardownInput,
    TeardownOutput,
)

log = logging.getLogger(__name__)

# Harbor lets an agent without [agent].timeout_sec run unbounded; an RL rollout needs a bound.
DEFAULT_AGENT_TIMEOUT_S = 3600.0


def network_modes(task: Task, run: RunNetwork) -> tuple[dict[str, str], dict[str, str]]:
    """Each phase's effective network mode for `task` (or a step's view) under `run`, and
    where each came from (`resolve_network`). A malformed network key is a broken task:
    `TaskInvalid`, refused before a sandbox exists."""
    modes: dict[str, str] = {}
    origins: dict[str, str] = {}
    for phase in PHASES:
        try:
            policy, origin = resolve_network(task, phase, phase_network(run, phase))
        except NetworkPolicyError as err:
            raise TaskInvalid(str(task.path), "task.toml", None, str(err)) from None
        modes[phase], origins[phase] = policy.mode, origin
    return modes, origins


def step_plans(task: Task, run: RunNetwork | None = None) -> list[StepPlan]:
    """The steps as the workflow runs them: each step's own timeouts and network
    (`Task.step_view`)."""
    plans = []
    for step, cfg in zip(task.steps, task.config.steps or [], strict=True):
        view = task.step_view(step.name)
        modes, origins = network_modes(view, run or RunNetwork())
        plans.append(
            StepPlan(
                name=step.name,
                index=step.index,
                agent_timeout_s=view.config.agent.timeout_sec or DEFAULT_AGENT_TIMEOUT_S,
                verifier_timeout_s=view.config.verifier.timeout_sec,
                min_reward=cfg.min_reward,
                network_modes=modes,
                network_origins=origins,
            )
        )
    return plans


class SandboxActivities:
    """`store_uri(key)` maps a store key to its URI (the store the scaffold writes to).
    The scaffold named in the input decides the sandbox's mounts (host-installed CLIs).
    `admission` (the worker's): each sandbox made here holds a lease on its sandbox gate
    from the end of its set-up to its teardown (trialflow.admission)."""

    def __init__(
        self,
        backend: SandboxBackend,
        store_uri: Callable[[str], str],
        host_queue: str,
        metrics: TrialMetrics,
        egresses: Egresses | None = None,
        admission: Admission | None = None,
        lease: HostLease | None = None,
    ) -> None:
        self._admission = admission
        self._egresses = egresses if egresses is not None else Egresses()
        self._backend = backend
        self._store_uri = store_uri
        self._host_queue = host_queue
        self._metrics = metrics
        self._lease = lease
        # Sandboxes created here and not yet torn down -> their trial's workflow id, and the
        # attempt they belong to (the lease's fence checks).
        self._live: dict[str, str] = {}
        self._held: dict[str, HeldSandbox] = {}

    @property
    def live(self) -> int:
        """Sandboxes created by this worker and not torn down yet (drain waits on it)."""
        return len(self._live)

    def live_workflows(self) -> set[str]:
        """Workflow ids of the trials whose sandboxes live here."""
        return set(self._live.values())

    def held(self) -> list[HeldSandbox]:
        """The sandboxes this worker holds, with their attempts."""
        return list(self._held.values())

    async def forfeit(self, sandbox_id: str) -> None:
        """Remove a sandbox whose attempt was fenced or whose lease lapsed. Never raises:
        one that cannot be removed now is left to the reaper (logged)."""
        try:
            sandbox = await self._backend.attach(sandbox_id)
            await self._egresses.close(sandbox.id)
            await sandbox.stop()
        except SandboxLost:
            pass
        except Exception as err:  # a failing engine: the periodic reaper tries again
            log.warning("could not remove forfeited sandbox %s: %s", sandbox_id, err)
        self._forget(sandbox_id)

    def _forget(self, sandbox_id: str) -> None:
        """`sandbox_id` is gone: no longer live or held here, its admission lease ended."""
        self._live.pop(sandbox_id, None)
        self._held.pop(sandbox_id, None)
        if self._admission is not None:
            self._admission.end_lease(sandbox_id)
        self._metrics.trials_running.set(len(self._live))

    async def lease_round(self) -> LeaseRound | None:
        """One round of this host's lease (None without one)."""
        if self._lease is None:
            return None
        return await self._lease.check(self.held, self.forfeit)

    @activity.defn(name="trial.setup")
    async def setup(self, inp: SetupInput) -> SetupOutput:
        started = time.monotonic()
        with typed_errors():
            if self._lease is not None:
                await self.lease_round()
                if not self._lease.accepting:
                    raise HostFenced(f"{self._host_queue} has not re-registered since it was lost")
            task = load_task(inp.task_path)
            modes, origins = network_modes(task, inp.network)
            plans = step_plans(task, inp.network)
            if modes["agent"] == "public" or any(p.network_modes["agent"] == "public" for p in plans):
                activity.logger.warning(
                    "task %s: the agent phase gets network mode public: %s", task.name, modes
                )
            # The backend adds its own labels (managed, trial id, worker); these say more.
            labels = {**inp.labels, "trialflow.attempt": str(inp.attempt)}
            mounts = list(get_scaffold(inp.scaffold, **inp.scaffold_options).mounts()) if inp.scaffold else []
            progress = self._backend.image_progress
            async with heartbeating(lambda: progress(task), interval_s=heartbeat_interval()):
                sandbox = await self._backend.create(
                    task,
                    trial_id=f"{inp.trial_id}-a{inp.attempt}",
                    labels=labels,
                    mounts=mounts,
                )
                try:
                    await self._start(sandbox)
                    hc = task.config.environment.healthcheck
                    if hc is not None:  # Harbor gates the agent on it; see trialflow.healthcheck

                        async def one_try(cmd: str, timeout_s: float, sb=sandbox) -> ExecResult:
                            return await sb.exec(["sh", "-c", cmd], timeout_s=timeout_s)

                        await run_healthcheck(hc, one_try)
                except BaseException:
                    await sandbox.stop()
                    raise
        workflow_id = activity.info().workflow_id
        assert workflow_id is not None  # always set for a workflow's activity
        self._live[sandbox.id] = workflow_id
        if self._admission is not None:  # before the set-up's slot goes back (trialflow.admission)
            self._admission.lease(sandbox.id)
        self._held[sandbox.id] = HeldSandbox(sandbox.id, inp.batch_id, inp.trial_id, inp.attempt)
        self._metrics.trials_running.set(len(self._live))
        seconds = time.monotonic() - started
        self._metrics.phase_seconds.labels("setup").observe(seconds)
        agent_timeout = task.config.agent.timeout_sec
        strategy = task.config.multi_step_reward_strategy
        return SetupOutput(
            sandbox_id=sandbox.id,
            host_queue=self._host_queue,
            attempt_uri=self._store_uri(TrialKeys(inp.batch_id, inp.trial_id, inp.attempt).root),
            agent_timeout_s=agent_timeout if agent_timeout is not None else DEFAULT_AGENT_TIMEOUT_S,
            verifier_timeout_s=task.config.verifier.timeout_sec,
            seconds=seconds,
            network_mode=modes["agent"]
            if modes["agent"] == modes["verifier"]
            else f"agent {modes['agent']}, verifier {modes['verifier']}",
            network_modes=modes,
            network_origins=origins,
            steps=plans,
            multi_step_reward_strategy=strategy.value if strategy is not None else None,
            engine_id=await self._backend.engine_id(),
        )

    async def _start(self, sandbox: Sandbox) -> None:
        """Start `sandbox`, its time (or its failure) a signal of the host's load to admission."""
        started = time.monotonic()
        try:
            await sandbox.start()
        except Exception:
            if self._admission is not None:
                self._admission.starts.observe(time.monotonic() - started, failed=True)
            raise
        if self._admission is not None:
            self._admission.starts.observe(time.monotonic() - started)

    @activity.defn(name="trial.teardown")
    async def teardown(self, inp: TeardownInput) -> TeardownOutput:
        """Idempotent: an absent sandbox is already torn down. A sandbox on another engine
        (the fallback teardown of a lost host's sandbox) is not touched: removed False."""
        started = time.monotonic()
        with typed_errors():
            mine = await self._backend.engine_id()
            if inp.engine_id is not None and inp.engine_id != mine:
                note = f"on engine {inp.engine_id}, not this worker's ({mine}): left to its host's lease"
                return TeardownOutput(seconds=time.monotonic() - started, removed=False, note=note)
            try:
                sandbox = await self._backend.attach(inp.sandbox_id)
            except SandboxLost:
                self._forget(inp.sandbox_id)
                note = "absent from this engine (removed before)"
                return TeardownOutput(seconds=time.monotonic() - started, removed=False, note=note)
            await self._egresses.close(sandbox.id)
            await sandbox.stop()
        self._forget(sandbox.id)
        seconds = time.monotonic() - started
        self._metrics.phase_seconds.labels("teardown").observe(seconds)
        return TeardownOutput(seconds=seconds, removed=True)
