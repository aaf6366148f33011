"""Sandbox set-up and teardown activities.

`setup` runs on the shared queue (any worker); it builds/creates and starts the sandbox
on THIS worker's Docker engine and answers with this worker's host queue, where every
later activity of the attempt is scheduled. `teardown` runs on that host queue, or on the
shared queue as a fallback when the owning worker is gone (a worker on the same engine
removes the container; elsewhere it is a no-op and the periodic reaper catches it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from temporalio import activity

from activities._support import heartbeat_interval, heartbeating, phase_network, typed_errors
from trialflow.admission import Admission
from trialflow.errors import SandboxLost, TaskInvalid
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
    ) -> None:
        self._admission = admission
        self._egresses = egresses if egresses is not None else Egresses()
        self._backend = backend
        self._store_uri = store_uri
        self._host_queue = host_queue
        self._metrics = metrics
        # Sandboxes created here and not yet torn down -> their trial's workflow id.
        self._live: dict[str, str] = {}

    @property
    def live(self) -> int:
        """Sandboxes created by this worker and not torn down yet (drain waits on it)."""
        return len(self._live)

    def live_workflows(self) -> set[str]:
        """Workflow ids of the trials whose sandboxes live here."""
        return set(self._live.values())

    @activity.defn(name="trial.setup")
    async def setup(self, inp: SetupInput) -> SetupOutput:
        started = time.monotonic()
        with typed_errors():
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
        """Idempotent: an absent sandbox is already torn down."""
        started = time.monotonic()
        with typed_errors():
            try:
                sandbox = await self._backend.attach(inp.sandbox_id)
            except SandboxLost:
                self._forget(inp.sandbox_id)
                return TeardownOutput(seconds=time.monotonic() - started)
            await self._egresses.close(sandbox.id)
            await sandbox.stop()
        self._forget(sandbox.id)
        seconds = time.monotonic() - started
        self._metrics.phase_seconds.labels("teardown").observe(seconds)
        return TeardownOutput(seconds=seconds)

    def _forget(self, sandbox_id: str) -> None:
        """`sandbox_id` is gone: no longer live here, its admission lease ended."""
        self._live.pop(sandbox_id, None)
        if self._admission is not None:
            self._admission.end_lease(sandbox_id)
        self._metrics.trials_running.set(len(self._live))
