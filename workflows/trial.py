"""TrialWorkflow: one trial = set up a sandbox, run the scaffold, verify, tear down.

Orchestration only; all I/O lives in the activities (activities/). Per attempt:

    setup    (`setup_queue` of the workflow's own task queue, any worker)
                                         -> sandbox id + the owning worker's host queue
    scaffold (host queue)                -> agent outcome, trajectory in the store
    verify   (host queue)                -> rewards
    teardown (host queue, ALWAYS: in `finally`, shielded from cancellation)

Multi-step tasks (`[[steps]]`; `SetupOutput.steps` non-empty), as Harbor 0.25 runs them: in
the one sandbox, per step in order, three durable phases

    step_setup (host queue)              workdir, setup.sh, step healthcheck (trial.prepare_step)
    scaffold   (host queue)              the step's instruction, its own session/trajectory
    verify     (host queue)              the step's tests -> the step's rewards (in the agent's
                                         sandbox, or in the step's own verifier sandbox, all
                                         inside the one activity: no extra commands)

then `trialflow.multi_step.stop_reason` decides whether the next step runs (failed step
set-up, no valid reward, `min_reward` not met), and at the end `combine_rewards` makes the
trial's rewards by `multi_step_reward_strategy`. Each step gets its own agent timeout
(`StepPlan`); a lost host restarts the attempt from the first step (live: steps are not
replayed). A single-step task's command sequence is unchanged, and multi-step tasks were
refused at load before this path existed, so no open history can meet it (the checked-in
multi_step history guards it from here on).

Failure rules:
- An agent timeout is an outcome (termination "timeout"); the sandbox is verified anyway.
- A lost host (schedule-to-start / heartbeat / start-to-close timeout of an activity on the
  host queue) or a retryable scaffold-activity failure ends the attempt; the workflow starts
  over with a new sandbox, up to `TrialSpec.attempt_limit` attempts. Every attempt that got a
  sandbox has an `AttemptRecord` in the result (its final trajectory URI, its checkpoint
  prefix, and whether it reported back: a lost attempt did not).
- Resume by replay: the attempt after a lost one runs its scaffold with
  `ScaffoldInput.replay_from` (the lost attempt's `AttemptRecord`) set, so its proxy session answers the scaffold from the
  lost attempt's record while the requests match it and generates live from the first that
  does not (proxy.replay). Its trajectory holds the replayed and the generated turns (one
  exact trajectory, the last URI); the result counts both (`replayed_turns`,
  `generated_turns`); the reward is that attempt's.
- Set-up and verify failures are retried by their activity retry policies; a typed
  non-retryable `ApplicationError` (broken task, image that fails to build) ends the trial
  at once. Either way the error is returned as data (`TrialResult.error`), the workflow
  itself completes.
- Fenced failover (patch `FENCED_FAILOVER`): an attempt lost with its HOST (a timeout on the
  host queue) is fenced first: `trial.fence_attempt` on the shared queue raises the trial's
  epoch above it in the store, so nothing it writes later is kept (trialflow.fencing). Then the
  next attempt starts at once; nothing waits on the lost host's queue. Its sandbox is left to
  the host (which removes fenced sandboxes itself when it returns, under its lease), and a
  fallback teardown on the shared queue runs meanwhile, in the background (and no attempt
  backoff: the next attempt's set-up goes to whichever host polls): a worker on the
  same engine removes it, one elsewhere says it removed nothing. The workflow awaits those
  teardowns before it stores the result. A retryable scaffold failure (the host alive) is
  torn down on its host as before.
- Cancellation tears the sandbox down and completes with termination "cancelled".

Determinism: change the command sequence only behind ``workflow.patched("<id>")`` (keep the
old branch until no open history needs it, then ``workflow.deprecate_patch``); the Replayer
test in tests/workflows/ replays a recorded history against this code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey, SearchAttributeUpdate
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    TimeoutError,
    TimeoutType,
)

with workflow.unsafe.imports_passed_through():
    from activities.sandbox import SandboxActivities
    from activities.scaffold import ScaffoldActivities
    from activities.steps import StepActivities
    from activities.store import StoreActivities
    from activities.verify import VerifyActivities
    from trialflow import trial_details
    from trialflow.multi_step import combine_rewards, stop_reason
    from trialflow.storage import AttemptRecord
    from trialflow.verifier import scalar_reward
    from workflows.shared import (
        SA_BATCH,
        SA_OUTCOME,
        SA_REWARD,
        SA_REWARD_VALID,
        SA_SCAFFOLD,
        SA_STEP,
        SA_TASK,
        SA_TERMINATION,
        WORKFLOW_NAME,
        FenceInput,
        Phase,
        PrepareStepInput,
        ScaffoldHeartbeat,
        ScaffoldInput,
        ScaffoldOutput,
        SetupInput,
        SetupOutput,
        StepPlan,
        StepResult,
        StoreResultInput,
        TeardownInput,
        TeardownOutput,
        Termination,
        TrialCounters,
        TrialError,
        TrialProgress,
        TrialResult,
        TrialSpec,
        VerifierTrust,
        VerifyInput,
        VerifyOutput,
        setup_queue,
    )

# Set-up builds images (minutes on a cold cache) and is retried on any worker.
SETUP_TIMEOUT = timedelta(minutes=20)
SETUP_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_attempts=3)
VERIFY_RETRY = RetryPolicy(initial_interval=timedelta(seconds=2), maximum_attempts=3)
TEARDOWN_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
STORE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=5)
# The scaffold cannot resume inside a half-used sandbox: one try per attempt, the
# workflow starts a new attempt instead.
SCAFFOLD_RETRY = RetryPolicy(maximum_attempts=1)
# Backstops beyond the timeouts the activities enforce themselves.
SCAFFOLD_GRACE = timedelta(minutes=2)
# How long a scaffold activity may wait on its host for a model-phase unit (trialflow.admission)
# before its agent starts: queued there, heartbeating, within its start-to-close timeout.
ADMISSION_WAIT = timedelta(minutes=10)
VERIFY_GRACE = timedelta(minutes=1)
TEARDOWN_TIMEOUT = timedelta(minutes=2)
ATTEMPT_BACKOFF = timedelta(seconds=2)
# Patch id: the attempt after a lost one replays its recorded turns (ScaffoldInput.replay_from).
REPLAY_LOST_ATTEMPT = "replay-lost-attempt"
# Patch id: a multi-step trial's per-step rewards in the memo (`trialflow status` shows them).
STEP_REWARDS_MEMO = "step-rewards-memo"
# Patch id: the TrialOutcome search attribute at the end (ok / invalid / error).
OUTCOME_SEARCH_ATTRIBUTE = "outcome-search-attribute"
# Patch id: a host-lost attempt is fenced and the next starts at once (module docstring).
FENCED_FAILOVER = "fenced-failover"
# One small read and write; short, so a fence handed to a host that stopped answering is soon
# retried elsewhere.
FENCE_TIMEOUT = timedelta(seconds=5)
# Set-up heartbeats from its start; a set-up handed to a lost host is retried after this.
SETUP_HEARTBEAT_CAP = timedelta(seconds=10)

InT = TypeVar("InT")
OutT = TypeVar("OutT")

_HOST_LOST = {
    TimeoutType.SCHEDULE_TO_START,
    TimeoutType.HEARTBEAT,
    TimeoutType.START_TO_CLOSE,
}


class _AttemptLost(Exception):
    """This attempt's sandbox or worker is gone; a new attempt may succeed. `host_lost`: by a
    timeout on the host queue (its host is presumed gone), not a failure its host reported."""

    def __init__(self, error: TrialError, host_lost: bool = False) -> None:
        super().__init__(error.message)
        self.error = error
        self.host_lost = host_lost
        self.fenced = False  # set once the workflow fenced it (FENCED_FAILOVER)


class _TrialFailed(Exception):
    """The trial cannot succeed (non-retryable error, or retries exhausted)."""

    def __init__(self, error: TrialError, termination: Termination) -> None:
        super().__init__(error.message)
        self.error = error
        self.termination = termination


@dataclass
class _Tally:
    """What the attempts add up to; folded into the TrialResult at the end."""

    timings: dict[str, float] = field(default_factory=dict)
    attempt_records: list[AttemptRecord] = field(default_factory=list)
    scaffold: ScaffoldOutput | None = None
    verify: VerifyOutput | None = None
    attempts: int = 0
    network_mode: str = "no-network"
    network_modes: dict[str, str] = field(default_factory=dict)
    network_origins: dict[str, str] = field(default_factory=dict)
    steps: list[StepResult] = field(default_factory=list)  # the finishing attempt's (multi-step)
    strategy: str | None = None

    def add_time(self, phase: str, seconds: float) -> None:
        self.timings[phase] = round(self.timings.get(phase, 0.0) + seconds, 3)


def classify(err: ActivityError, phase: Phase, attempt: int) -> TrialError:
    """Turn an activity failure into data: the innermost cause's type and message."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        return TrialError(
            type=cause.type or "ApplicationError",
            message=cause.message,
            phase=phase,
            non_retryable=cause.non_retryable,
            attempt=attempt,
        )
    if isinstance(cause, TimeoutError):
        kind = cause.type.name if cause.type is not None else "UNKNOWN"
        return TrialError(
            type=f"ActivityTimeout.{kind}",
            message=str(cause),
            phase=phase,
            attempt=attempt,
        )
    return TrialError(
        type=type(cause).__name__ if cause else "ActivityError",
        message=str(cause or err),
        phase=phase,
        attempt=attempt,
    )


def _host_lost(err: ActivityError) -> bool:
    return isinstance(err.cause, TimeoutError) and err.cause.type in _HOST_LOST


@workflow.defn(name=WORKFLOW_NAME)
class TrialWorkflow:
    def __init__(self) -> None:
        self._progress = TrialProgress()
        self._spec: TrialSpec | None = None
        # Fallback teardowns of fenced attempts, running while later attempts do.
        self._teardowns: list[workflow.ActivityHandle[TeardownOutput]] = []

    @workflow.query
    def progress(self) -> TrialProgress:
        return self._progress

    @workflow.signal
    def report_progress(self, beat: ScaffoldHeartbeat) -> None:
        """Fed by the scaffold activity; beats from an older attempt are ignored."""
        if beat.attempt == self._progress.attempt and self._progress.phase == "scaffold":
            self._progress.turns = beat.turns
            self._progress.prompt_tokens = beat.prompt_tokens
            self._progress.response_tokens = beat.response_tokens
            self._show_progress()

    def _show_progress(self) -> None:
        """The UI's current details while the trial runs (no command: replays unchanged)."""
        if self._spec is not None:
            workflow.set_current_details(trial_details.live_details(self._progress, self._spec))

    @workflow.run
    async def run(self, spec: TrialSpec) -> TrialResult:
        self._spec = spec
        self._ensure_start_attributes(spec)
        tally = _Tally()
        termination: Termination | None = None
        error: TrialError | None = None
        replay_from: AttemptRecord | None = None
        try:
            for attempt in range(1, spec.attempt_limit + 1):
                try:
                    await self._attempt(spec, attempt, tally, replay_from)
                    error, termination = (
                        None,
                        None,
                    )  # an earlier lost attempt is history
                    break
                except _AttemptLost as lost:
                    error = lost.error
                    termination = "infra_error"
                    if attempt < spec.attempt_limit:
                        # The next attempt's scaffold replays what this one recorded (its
                        # checkpoints already hold any turns it replayed itself).
                        lost_record = tally.attempt_records[-1] if tally.attempt_records else None
                        if (
                            lost_record is not None
                            and lost_record.attempt == attempt
                            and workflow.patched(REPLAY_LOST_ATTEMPT)
                        ):
                            replay_from = lost_record
                        if not lost.fenced:  # a fenced host's next attempt goes elsewhere: no wait
                            await workflow.sleep(ATTEMPT_BACKOFF)
                except _TrialFailed as failed:
                    error, termination = failed.error, failed.termination
                    break
        except asyncio.CancelledError:
            termination = "cancelled"
            error = TrialError(
                type="Cancelled",
                message="trial workflow cancelled",
                phase=self._progress.phase,
                attempt=self._progress.attempt,
            )
        await self._await_teardowns(tally)
        result = self._result(spec, tally, termination, error)
        self._progress.phase = "done"
        stored = await workflow.execute_activity_method(
            StoreActivities.store_result,
            StoreResultInput(result=result),
            summary=f"store result · {result.termination_reason} · reward {result.reward:.3f}",
            task_queue=workflow.info().task_queue,
            start_to_close_timeout=timedelta(minutes=1),
            retry_policy=STORE_RETRY,
        )
        result.result_uri = stored.result_uri
        attributes: list[SearchAttributeUpdate[Any]] = [
            SearchAttributeKey.for_float(SA_REWARD).value_set(result.reward),
            SearchAttributeKey.for_keyword(SA_TERMINATION).value_set(result.termination_reason),
        ]
        if workflow.patched("reward-valid-search-attribute"):
            valid = "true" if result.reward_valid else "false"
            attributes.append(SearchAttributeKey.for_keyword(SA_REWARD_VALID).value_set(valid))
        workflow.upsert_search_attributes(attributes)
        if workflow.patched("reward-components-memo"):  # `trialflow status` shows them
            workflow.upsert_memo({"rewards": dict(result.rewards)})
        if result.step_results and workflow.patched(STEP_REWARDS_MEMO):
            workflow.upsert_memo({"steps": [_step_memo(s) for s in result.step_results]})
        if workflow.patched(OUTCOME_SEARCH_ATTRIBUTE):
            outcome = trial_details.outcome(result)
            workflow.upsert_search_attributes([SearchAttributeKey.for_keyword(SA_OUTCOME).value_set(outcome)])
        workflow.set_current_details(trial_details.final_details(result, spec))
        return result

    async def _attempt(
        self, spec: TrialSpec, attempt: int, tally: _Tally, replay_from: AttemptRecord | None = None
    ) -> None:
        """One attempt with a fresh sandbox, replaying `replay_from`'s record if set.
        Raises _AttemptLost or _TrialFailed."""
        tally.attempts = attempt
        tally.scaffold = tally.verify = None
        self._progress = TrialProgress(phase="setup", attempt=attempt)
        setup = await self._run_phase(
            "setup",
            attempt,
            tally,
            SandboxActivities.setup,
            SetupInput(
                batch_id=spec.batch_id,
                trial_id=spec.trial_id,
                attempt=attempt,
                task_path=spec.task_path,
                scaffold=spec.scaffold,
                scaffold_options=spec.scaffold_options,
                labels={"trialflow.batch": spec.batch_id},
                network=spec.network,
            ),
            summary=activity_summary("setup", attempt, spec),
            task_queue=setup_queue(workflow.info().task_queue),
            start_to_close_timeout=SETUP_TIMEOUT,
            heartbeat_timeout=min(timedelta(seconds=spec.heartbeat_timeout_s), SETUP_HEARTBEAT_CAP),
            retry_policy=SETUP_RETRY,
        )
        self._progress.host_queue = setup.host_queue
        tally.network_mode = setup.network_mode
        tally.network_modes, tally.network_origins = setup.network_modes, setup.network_origins
        # Until the scaffold reports, the attempt's checkpoints are all there is.
        tally.attempt_records.append(AttemptRecord.begun(attempt, setup.attempt_uri))
        fenced = False
        try:
            await self._scaffold_and_verify(spec, attempt, tally, setup, replay_from)
        except _AttemptLost as lost:
            if lost.host_lost and workflow.patched(FENCED_FAILOVER):
                fenced = lost.fenced = True
                self._progress.phase = "teardown"
                await asyncio.shield(self._fence(spec, attempt, tally, setup, lost.error))
            raise
        finally:
            # Not in the workflow's loop: the coroutine is being closed by garbage collection
            # (a worker process exiting with the workflow cached), nothing to tear down from here.
            if workflow.in_workflow() and not fenced:
                self._progress.phase = "teardown"
                self._show_progress()
                await asyncio.shield(self._teardown(spec, attempt, tally, setup))

    async def _scaffold_and_verify(
        self,
        spec: TrialSpec,
        attempt: int,
        tally: _Tally,
        setup: SetupOutput,
        replay_from: AttemptRecord | None = None,
    ) -> None:
        host: dict[str, Any] = {
            "task_queue": setup.host_queue,
            "schedule_to_start_timeout": timedelta(seconds=spec.host_schedule_timeout_s),
            "heartbeat_timeout": timedelta(seconds=spec.heartbeat_timeout_s),
        }
        if setup.steps:
            await self._run_steps(spec, attempt, tally, setup, host)
            return
        scaffold = await self._scaffold(
            spec, attempt, tally, setup, host, spec.agent_timeout_s or setup.agent_timeout_s, replay_from
        )
        tally.scaffold = scaffold
        # trajectory_uri None: a model-free scaffold (oracle, nop): no session, no trajectory
        tally.attempt_records[-1] = tally.attempt_records[-1].finished(scaffold.trajectory_uri or None)
        self._progress.turns = scaffold.turns
        self._progress.prompt_tokens = scaffold.prompt_tokens
        self._progress.response_tokens = scaffold.response_tokens
        tally.verify = await self._verify(spec, attempt, tally, setup, host, setup.verifier_timeout_s)

    async def _scaffold(
        self,
        spec: TrialSpec,
        attempt: int,
        tally: _Tally,
        setup: SetupOutput,
        host: dict[str, Any],
        agent_timeout: float,
        replay_from: AttemptRecord | None = None,
        step: StepPlan | None = None,
    ) -> ScaffoldOutput:
        """The scaffold phase of the attempt, or of one of its steps."""
        self._progress.phase = "scaffold"
        return await self._run_phase(
            "scaffold",
            attempt,
            tally,
            ScaffoldActivities.run_scaffold,
            ScaffoldInput(
                batch_id=spec.batch_id,
                trial_id=spec.trial_id,
                attempt=attempt,
                sandbox_id=setup.sandbox_id,
                task_path=spec.task_path,
                scaffold=spec.scaffold,
                scaffold_options=spec.scaffold_options,
                agent_timeout_s=agent_timeout,
                model=spec.model,
                sampling=spec.sampling,
                replicas=spec.replicas,
                policy_version=spec.policy_version,
                max_context_tokens=spec.max_context_tokens,
                max_response_tokens=spec.max_response_tokens,
                replay_from=replay_from,
                step=step.name if step else None,
                network=spec.network,
            ),
            summary=activity_summary("scaffold", attempt, spec, note=_step_note(setup, step)),
            start_to_close_timeout=timedelta(seconds=agent_timeout) + SCAFFOLD_GRACE + ADMISSION_WAIT,
            retry_policy=SCAFFOLD_RETRY,
            lose_attempt_on_retryable=True,
            **host,
        )

    async def _verify(
        self,
        spec: TrialSpec,
        attempt: int,
        tally: _Tally,
        setup: SetupOutput,
        host: dict[str, Any],
        timeout_s: float,
        step: StepPlan | None = None,
    ) -> VerifyOutput:
        """The verify phase of the attempt, or of one of its steps."""
        self._progress.phase = "verify"
        return await self._run_phase(
            "verify",
            attempt,
            tally,
            VerifyActivities.verify,
            VerifyInput(
                batch_id=spec.batch_id,
                trial_id=spec.trial_id,
                attempt=attempt,
                sandbox_id=setup.sandbox_id,
                task_path=spec.task_path,
                verifier_timeout_s=timeout_s,
                step=step.name if step else None,
                network=spec.network,
            ),
            summary=activity_summary("verify", attempt, spec, note=_step_note(setup, step)),
            start_to_close_timeout=timedelta(seconds=timeout_s) + VERIFY_GRACE,
            retry_policy=VERIFY_RETRY,
            **host,
        )

    async def _run_steps(
        self, spec: TrialSpec, attempt: int, tally: _Tally, setup: SetupOutput, host: dict[str, Any]
    ) -> None:
        """A multi-step task's steps in this attempt's sandbox (module docstring); then the
        steps' totals become the attempt's scaffold/verify outcome."""
        tally.steps, tally.strategy = [], setup.multi_step_reward_strategy
        for i, plan in enumerate(setup.steps):
            step = await self._run_step(spec, attempt, tally, setup, host, plan)
            tally.steps.append(step)
            setup_failed = step.error is not None and step.termination_reason is None
            reason = stop_reason(step.rewards if step.reward_valid else None, plan.min_reward, setup_failed)
            if reason is not None and i + 1 < len(setup.steps):
                step.stopped = reason  # the later steps never run
                break
        tally.attempt_records[-1] = tally.attempt_records[-1].finished(None)  # trajectories: per step
        tally.scaffold, tally.verify = _steps_outcome(tally.steps, tally.strategy)

    async def _run_step(
        self,
        spec: TrialSpec,
        attempt: int,
        tally: _Tally,
        setup: SetupOutput,
        host: dict[str, Any],
        plan: StepPlan,
    ) -> StepResult:
        self._progress.phase = "step_setup"
        prepared = await self._run_phase(
            "step_setup",
            attempt,
            tally,
            StepActivities.prepare_step,
            PrepareStepInput(
                batch_id=spec.batch_id,
                trial_id=spec.trial_id,
                attempt=attempt,
                sandbox_id=setup.sandbox_id,
                task_path=spec.task_path,
                step=plan.name,
            ),
            summary=activity_summary("step_setup", attempt, spec, note=_step_note(setup, plan)),
            start_to_close_timeout=SETUP_TIMEOUT,
            retry_policy=SETUP_RETRY,
            **host,
        )
        timings = {"step_setup": round(prepared.seconds, 3)}
        if prepared.error is not None:
            return StepResult(name=plan.name, error=prepared.error, timings=timings)
        agent_timeout = spec.agent_timeout_s or plan.agent_timeout_s
        scaffold = await self._scaffold(spec, attempt, tally, setup, host, agent_timeout, step=plan)
        verify = await self._verify(spec, attempt, tally, setup, host, plan.verifier_timeout_s, step=plan)
        timings.update(scaffold=round(scaffold.seconds, 3), verify=round(verify.seconds, 3))
        return StepResult(
            name=plan.name,
            rewards=verify.rewards,
            reward=verify.reward,
            reward_valid=verify.reward_valid,
            reward_error=verify.reward_error,
            verifier_trust=verify.verifier_trust,
            termination_reason=scaffold.termination_reason,
            error=scaffold.error,
            **scaffold.counters(),
            trajectory_uri=scaffold.trajectory_uri,
            logs_uri=scaffold.logs_uri,
            timings=timings,
            network_modes=plan.network_modes,
            network_origins=plan.network_origins,
        )

    async def _run_phase(
        self,
        phase: Phase,
        attempt: int,
        tally: _Tally,
        activity: Callable[[Any, InT], Awaitable[OutT]],
        arg: InT,
        *,
        summary: str,
        lose_attempt_on_retryable: bool = False,
        **options: Any,
    ) -> OutT:
        """Run one activity, time it, and map its failure onto the attempt/trial rules.
        `summary` labels the activity in the Temporal UI (see `activity_summary`). Typed
        by the activity method, so callers need no runtime type checks (an assert failing
        in a workflow is a workflow-task failure that Temporal retries forever)."""
        started = workflow.now()
        self._show_progress()
        try:
            return await workflow.execute_activity_method(activity, arg, summary=summary, **options)
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                # The workflow was cancelled while this activity ran (TRY_CANCEL).
                raise asyncio.CancelledError() from err
            error = classify(err, phase, attempt)
            if _host_lost(err) and phase != "setup":
                # the message in words: which host, what timed out (the UI and the result show it)
                error.message = lost_message(err, phase, attempt, options)
                raise _AttemptLost(error, host_lost=True) from err
            if error.non_retryable:
                raise _TrialFailed(error, _termination_for(phase, error)) from err
            if lose_attempt_on_retryable:
                raise _AttemptLost(error) from err
            raise _TrialFailed(error, "infra_error") from err
        finally:
            if workflow.in_workflow():  # (else closed by garbage collection: see _attempt)
                tally.add_time(phase, (workflow.now() - started).total_seconds())

    async def _teardown(self, spec: TrialSpec, attempt: int, tally: _Tally, setup: SetupOutput) -> None:
        """Best effort, never raises. If the owning worker is gone, any worker on the same
        engine can still remove the container (shared-queue fallback); one on another engine
        removes nothing and says so, and the sandbox is left to its host's lease."""
        started = workflow.now()
        arg = TeardownInput(
            batch_id=spec.batch_id,
            trial_id=spec.trial_id,
            attempt=attempt,
            sandbox_id=setup.sandbox_id,
            engine_id=setup.engine_id,
        )
        try:
            await workflow.execute_activity_method(
                SandboxActivities.teardown,
                arg,
                summary=activity_summary("teardown", attempt, spec),
                task_queue=setup.host_queue,
                schedule_to_start_timeout=timedelta(seconds=spec.host_schedule_timeout_s),
                start_to_close_timeout=TEARDOWN_TIMEOUT,
                retry_policy=TEARDOWN_RETRY,
            )
        except ActivityError as err:
            workflow.logger.warning("teardown of %s on its host failed: %s", setup.sandbox_id, err.cause)
            try:
                out = await workflow.execute_activity_method(
                    SandboxActivities.teardown,
                    arg,
                    summary=activity_summary("teardown", attempt, spec, note="fallback"),
                    task_queue=workflow.info().task_queue,
                    start_to_close_timeout=TEARDOWN_TIMEOUT,
                    retry_policy=TEARDOWN_RETRY,
                )
                if not out.removed:
                    workflow.logger.info("fallback teardown removed nothing: %s", out.note)
            except ActivityError as err2:
                workflow.logger.warning("fallback teardown of %s failed: %s", setup.sandbox_id, err2.cause)
        finally:
            if workflow.in_workflow():  # (else closed by garbage collection: see _attempt)
                tally.add_time("teardown", (workflow.now() - started).total_seconds())

    async def _fence(
        self, spec: TrialSpec, attempt: int, tally: _Tally, setup: SetupOutput, error: TrialError
    ) -> None:
        """Declare the attempt lost with its host (module docstring, fenced failover): the
        fence on the shared queue, then its fallback teardown started, not awaited."""
        started = workflow.now()
        shared = workflow.info().task_queue
        try:
            await workflow.execute_activity_method(
                StoreActivities.fence_attempt,
                FenceInput(
                    batch_id=spec.batch_id,
                    trial_id=spec.trial_id,
                    attempt=attempt,
                    host_queue=setup.host_queue,
                    reason=f"{error.type}: {error.message}"[:500],
                ),
                summary=activity_summary("fence", attempt, spec, note=setup.host_queue),
                task_queue=shared,
                start_to_close_timeout=FENCE_TIMEOUT,
                retry_policy=STORE_RETRY,
            )
        except ActivityError as err:  # the store is down: the next attempt cannot write either
            workflow.logger.warning("fence of attempt %d failed: %s", attempt, err.cause)
        tally.attempt_records[-1] = tally.attempt_records[-1].model_copy(
            update={"fenced": True, "host_queue": setup.host_queue}
        )
        self._teardowns.append(
            workflow.start_activity_method(
                SandboxActivities.teardown,
                TeardownInput(
                    batch_id=spec.batch_id,
                    trial_id=spec.trial_id,
                    attempt=attempt,
                    sandbox_id=setup.sandbox_id,
                    engine_id=setup.engine_id,
                ),
                summary=activity_summary("teardown", attempt, spec, note="fallback, host lost"),
                task_queue=shared,
                start_to_close_timeout=TEARDOWN_TIMEOUT,
                retry_policy=TEARDOWN_RETRY,
            )
        )
        tally.add_time("fence", (workflow.now() - started).total_seconds())

    async def _await_teardowns(self, tally: _Tally) -> None:
        """The fenced attempts' fallback teardowns, each as it ended (never raises)."""
        for handle in self._teardowns:
            started = workflow.now()
            try:
                out = await handle
                if not out.removed:
                    workflow.logger.info("fallback teardown removed nothing: %s", out.note)
            except (ActivityError, asyncio.CancelledError) as err:
                workflow.logger.warning("fallback teardown failed: %s", err)
            tally.add_time("teardown", (workflow.now() - started).total_seconds())
        self._teardowns.clear()

    def _ensure_start_attributes(self, spec: TrialSpec) -> None:
        """Clients set these at start; a workflow started elsewhere gets them here."""
        if workflow.info().typed_search_attributes.get(SearchAttributeKey.for_keyword(SA_BATCH)):
            return
        updates: list[SearchAttributeUpdate[Any]] = [
            SearchAttributeKey.for_keyword(SA_BATCH).value_set(spec.batch_id),
            SearchAttributeKey.for_keyword(SA_TASK).value_set(spec.task_name),
            SearchAttributeKey.for_keyword(SA_SCAFFOLD).value_set(spec.scaffold),
        ]
        if spec.step is not None:
            updates.append(SearchAttributeKey.for_int(SA_STEP).value_set(spec.step))
        workflow.upsert_search_attributes(updates)

    def _result(
        self,
        spec: TrialSpec,
        tally: _Tally,
        termination: Termination | None,
        error: TrialError | None,
    ) -> TrialResult:
        scaffold, verify = tally.scaffold, tally.verify
        if termination is None:
            termination = scaffold.termination_reason if scaffold else "infra_error"
            # The agent finished, but the verifier crashed or wrote no valid reward.
            if termination == "submitted" and verify is not None and not verify.reward_valid:
                termination = "verifier_error"
        if error is None and scaffold is not None:
            error = scaffold.error
        if scaffold is not None:
            counters = scaffold.counters()
        else:  # no scaffold outcome: what the heartbeats last reported
            progress = self._progress
            counters = TrialCounters(
                turns=progress.turns,
                prompt_tokens=progress.prompt_tokens,
                response_tokens=progress.response_tokens,
            ).counters()
        return TrialResult.of(
            spec,
            step_results=tally.steps,
            multi_step_reward_strategy=tally.strategy,
            rewards=verify.rewards if verify else {},
            reward=verify.reward if verify else 0.0,
            reward_valid=verify.reward_valid if verify else False,
            reward_error=verify.reward_error if verify else None,
            termination_reason=termination,
            network_mode=tally.network_mode,
            network_modes=tally.network_modes,
            network_origins=tally.network_origins,
            verifier_trust=verify.verifier_trust if verify else None,
            **counters,
            generated_turns=scaffold.turns - scaffold.replayed_turns if scaffold else 0,
            timings=tally.timings,
            attempts=tally.attempts,
            attempt_records=tally.attempt_records,
            logs_uri=scaffold.logs_uri if scaffold else None,
            error=error,
        )


def _step_memo(step: StepResult) -> dict[str, Any]:
    """What `status` shows of a step (small: memos are in every visibility listing)."""
    keep = {"name", "rewards", "reward", "reward_valid", "termination_reason", "stopped"}
    return step.model_dump(mode="json", include=keep)


def _step_note(setup: SetupOutput, step: StepPlan | None) -> str:
    return f"step {step.index}/{len(setup.steps)} {step.name}" if step else ""


def _steps_outcome(steps: list[StepResult], strategy: str | None) -> tuple[ScaffoldOutput, VerifyOutput]:
    """The steps as one attempt: counters summed, the last step's agent outcome (a failed
    step set-up: "setup_error"), rewards combined by `strategy` (trialflow.multi_step)."""
    last = steps[-1]
    scaffold = ScaffoldOutput(
        termination_reason=last.termination_reason or "setup_error",
        **TrialCounters.summed(steps),
        error=last.error,
        logs_uri=last.logs_uri,
    )
    combined = combine_rewards(strategy, [s.rewards if s.reward_valid else None for s in steps])
    trusts = {s.verifier_trust for s in steps if s.verifier_trust is not None}
    trust: VerifierTrust | None = "harness" if "harness" in trusts else ("separate" if trusts else None)
    if combined is None:
        reasons = [
            f"{s.name}: {s.reward_error or (s.error.message if s.error else 'no reward')}" for s in steps
        ]
        verify = VerifyOutput(
            reward_error="no step has a valid reward (" + "; ".join(reasons) + ")", verifier_trust=trust
        )
    else:
        verify = VerifyOutput(
            rewards=combined, reward=scalar_reward(combined), reward_valid=True, verifier_trust=trust
        )
    return scaffold, verify


def activity_summary(phase: str, attempt: int, spec: TrialSpec, note: str = "") -> str:
    """The one-line label an activity carries in the Temporal UI: phase, attempt, task,
    scaffold (e.g. "scaffold · trial attempt 2/3 · fix-bug · claude-code": the trial's attempt,
    which the UI's own "Attempt" of an activity retry is not). Only metadata: it is not part
    of the replay-checked command attributes."""
    label = f"{phase}{' (' + note + ')' if note else ''} · trial attempt {attempt}/{spec.attempt_limit}"
    return f"{label} · {spec.task_name} · {spec.scaffold}"


def lost_message(err: ActivityError, phase: Phase, attempt: int, options: dict[str, Any]) -> str:
    """Why an attempt was lost, in words: which activity, on which host queue, which timeout
    ran out and what that means (`err` is a host-lost timeout: `_host_lost`)."""
    assert isinstance(err.cause, TimeoutError)
    kind = err.cause.type
    queue = options.get("task_queue", "?")

    def seconds(key: str) -> str:
        value = options.get(key)
        return f"{value.total_seconds():g} s" if isinstance(value, timedelta) else "its limit"

    if kind == TimeoutType.SCHEDULE_TO_START:
        what = (
            f"was not picked up within {seconds('schedule_to_start_timeout')}: no worker polls that "
            "host's queue (its worker stopped or lost the Temporal server)"
        )
    elif kind == TimeoutType.HEARTBEAT:
        what = (
            f"sent no heartbeat for {seconds('heartbeat_timeout')}: its worker died, hung or lost "
            "the Temporal server"
        )
    else:
        what = f"did not finish within its {seconds('start_to_close_timeout')} limit"
    return f"attempt {attempt} lost: the {phase} activity on {queue} {what}"


def _termination_for(phase: Phase, error: TrialError) -> Termination:
    """A non-retryable failure: the task (set-up, verify) or the scaffold is broken."""
    if phase == "scaffold":
        return "scaffold_error"
    if phase == "setup":
        return "setup_error"
    return "verifier_error"
