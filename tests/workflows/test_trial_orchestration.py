"""TrialWorkflow's orchestration rules on a REAL Temporal dev server.

The activities here are small fakes registered under the real activity names (the
workflow's behaviour on lost hosts, typed errors, timeouts and cancellation is what is
under test; the real activities are exercised end to end in tests/activities/ and
tests/test_worker_crash.py). Also: re-submission does not duplicate, the `progress`
query, and a Replayer run over a history recorded here.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, Worker

from tests._wait import wait_until
from trialflow import batch
from workflows.shared import (
    FenceInput,
    FenceOutput,
    PrepareStepInput,
    PrepareStepOutput,
    ScaffoldHeartbeat,
    ScaffoldInput,
    ScaffoldOutput,
    SetupInput,
    SetupOutput,
    StepPlan,
    StoreResultInput,
    StoreResultOutput,
    TeardownInput,
    TeardownOutput,
    TrialError,
    TrialSpec,
    VerifyInput,
    VerifyOutput,
    setup_queue,
)
from workflows.trial import TrialWorkflow

pytestmark = pytest.mark.temporal

DEAD_QUEUE = "trialflow-host-nobody-polls"
HISTORIES = Path(__file__).parent / "histories"


@dataclass
class FakeTrial:
    """Records calls; `setup_queues` is popped per set-up (a dead queue simulates a lost host)."""

    live_queue: str
    setup_queues: list[str] = field(default_factory=list)
    setup_error: ApplicationError | None = None
    scaffold_termination: str = "submitted"
    scaffold_delay_s: float = 0.0
    calls: list[tuple[str, str, int]] = field(default_factory=list)  # (activity, queue, attempt)
    scaffold_inputs: list[ScaffoldInput] = field(default_factory=list)
    stored: list[StoreResultInput] = field(default_factory=list)
    # A multi-step task: the plans set-up reports, each step's rewards (None: invalid) and
    # the steps whose set-up fails.
    steps: list[StepPlan] = field(default_factory=list)
    strategy: str | None = None
    step_rewards: dict[str, dict[str, float] | None] = field(default_factory=dict)
    failing_step_setups: set[str] = field(default_factory=set)
    # Attempts whose scaffold stops heartbeating (a frozen host) for `hang_s`, then returns.
    hang_attempts: set[int] = field(default_factory=set)
    hang_s: float = 8.0
    fenced: list[FenceInput] = field(default_factory=list)

    def _note(self, name: str, attempt: int) -> None:
        self.calls.append((name, activity.info().task_queue, attempt))

    @activity.defn(name="trial.setup")
    async def setup(self, inp: SetupInput) -> SetupOutput:
        self._note("setup", inp.attempt)
        if self.setup_error is not None:
            raise self.setup_error
        queue = self.setup_queues.pop(0) if self.setup_queues else self.live_queue
        return SetupOutput(
            sandbox_id=f"sb-{inp.attempt}",
            host_queue=queue,
            attempt_uri=f"file:///store/{inp.trial_id}/attempt-{inp.attempt}",
            agent_timeout_s=30,
            verifier_timeout_s=30,
            seconds=0.01,
            steps=self.steps,
            multi_step_reward_strategy=self.strategy,
        )

    @activity.defn(name="trial.prepare_step")
    async def prepare_step(self, inp: PrepareStepInput) -> PrepareStepOutput:
        self._note(f"step_setup {inp.step}", inp.attempt)
        if inp.step in self.failing_step_setups:
            error = TrialError(type="StepSetupFailed", message="setup.sh exited 1", phase="step_setup")
            return PrepareStepOutput(error=error)
        return PrepareStepOutput(seconds=0.01)

    @activity.defn(name="trial.run_scaffold")
    async def run_scaffold(self, inp: ScaffoldInput) -> ScaffoldOutput:
        self._note("scaffold" if inp.step is None else f"scaffold {inp.step}", inp.attempt)
        self.scaffold_inputs.append(inp)
        if inp.attempt in self.hang_attempts:
            activity.heartbeat(ScaffoldHeartbeat(attempt=inp.attempt))
            await asyncio.sleep(self.hang_s)  # no heartbeat: the host looks lost
        deadline = asyncio.get_running_loop().time() + self.scaffold_delay_s
        while asyncio.get_running_loop().time() < deadline:
            activity.heartbeat(ScaffoldHeartbeat(attempt=inp.attempt, turns=1))
            await asyncio.sleep(0.2)
        return ScaffoldOutput(
            termination_reason=self.scaffold_termination,
            turns=3,
            replayed_turns=2 if inp.replay_from is not None else 0,
            tool_calls=2,
            prompt_tokens=100,
            response_tokens=40,
            trajectory_uri=f"file:///store/{inp.trial_id}/attempt-{inp.attempt}/trajectory.npz",
        )

    @activity.defn(name="trial.verify")
    async def verify(self, inp: VerifyInput) -> VerifyOutput:
        self._note("verify" if inp.step is None else f"verify {inp.step}", inp.attempt)
        if inp.step is not None and inp.step in self.step_rewards:
            rewards = self.step_rewards[inp.step]
            if rewards is None:
                return VerifyOutput(reward_error="RewardMissing: test.sh wrote neither")
            return VerifyOutput(rewards=rewards, reward=rewards.get("reward", 0.0), reward_valid=True)
        return VerifyOutput(rewards={"reward": 1.0}, reward=1.0, reward_valid=True)

    @activity.defn(name="trial.teardown")
    async def teardown(self, inp: TeardownInput) -> TeardownOutput:
        self._note("teardown", inp.attempt)
        return TeardownOutput()

    @activity.defn(name="trial.fence_attempt")
    async def fence_attempt(self, inp: FenceInput) -> FenceOutput:
        self._note("fence", inp.attempt)
        self.fenced.append(inp)
        return FenceOutput(epoch=inp.attempt + 1, fence_uri=f"file:///store/{inp.trial_id}/fence.json")

    @activity.defn(name="trial.store_result")
    async def store_result(self, inp: StoreResultInput) -> StoreResultOutput:
        self.stored.append(inp)
        return StoreResultOutput(result_uri=f"file:///store/{inp.result.trial_id}/result.json")


@pytest.fixture
async def client(temporal_address: str) -> Client:
    return await batch.connect(temporal_address)


@pytest.fixture
async def harness(client: Client) -> AsyncIterator[tuple[FakeTrial, str]]:
    """Workers for a fresh shared queue and a fresh live host queue."""
    suffix = uuid.uuid4().hex[:8]
    shared, live = f"test-shared-{suffix}", f"test-host-{suffix}"
    fake = FakeTrial(live_queue=live)
    acts = [
        fake.setup,
        fake.prepare_step,
        fake.run_scaffold,
        fake.verify,
        fake.teardown,
        fake.fence_attempt,
        fake.store_result,
    ]
    async with (
        Worker(client, task_queue=shared, workflows=[TrialWorkflow], activities=acts),
        Worker(client, task_queue=setup_queue(shared), activities=acts),
        Worker(client, task_queue=live, activities=acts),
    ):
        yield fake, shared


def _spec(**kw) -> TrialSpec:
    fields = {
        "batch_id": f"b{uuid.uuid4().hex[:6]}",
        "task_path": "/tasks/hello",
        "task_name": "hello",
        "scaffold": "oracle",
        # Generous on a loaded 2-core machine; tests with a dead queue shorten it.
        "heartbeat_timeout_s": 10,
        "host_schedule_timeout_s": 30,
    }
    return TrialSpec(**(fields | kw))


async def test_success_runs_every_phase_on_the_right_queue(client, harness):
    fake, shared = harness
    [result] = await batch.run(client, [_spec()], task_queue=shared)
    assert result.error is None and result.termination_reason == "submitted"
    assert result.reward == 1.0 and result.reward_valid and result.turns == 3
    queues = {setup_queue(shared): "setup queue", fake.live_queue: "host queue"}
    assert [(n, queues[q]) for n, q, _ in fake.calls] == [
        ("setup", "setup queue"), ("scaffold", "host queue"),
        ("verify", "host queue"), ("teardown", "host queue"),
    ]  # fmt: skip
    assert set(result.timings) == {"setup", "scaffold", "verify", "teardown"}
    assert result.trajectory_uris == [f"file:///store/{result.trial_id}/attempt-1/trajectory.npz"]
    assert result.result_uri and fake.stored[0].result.trial_id == result.trial_id
    # the Temporal UI's current details: how it went, where the records are, what to run next
    meta = await client.get_workflow_handle(result.trial_id).query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert meta.current_details.splitlines()[:2] == [
        "### reward 1.000 (valid) · submitted",
        "turns 3 (0 replayed, 3 generated) · 100 prompt / 40 generated tokens · 1 attempt",
    ], meta.current_details
    assert f"attempt 1 trajectory: `{result.trajectory_uris[0]}`" in meta.current_details
    assert f"`trialflow inspect {result.trial_id}`" in meta.current_details


async def test_activities_carry_ui_summaries(client, harness):
    """Every scheduled activity has a summary (phase, attempt, task, scaffold) in its
    event's user metadata: what the Temporal UI shows on the timeline."""
    _, shared = harness
    spec = _spec(attempt_limit=2)
    await batch.run(client, [spec], task_queue=shared)
    history = await client.get_workflow_handle(spec.trial_id).fetch_history()
    converter = client.data_converter.payload_converter
    summaries = [
        converter.from_payload(e.user_metadata.summary, str)
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert summaries == [  # the trial's attempt, not the UI's own "Attempt" of an activity retry
        "setup · trial attempt 1/2 · hello · oracle",
        "scaffold · trial attempt 1/2 · hello · oracle",
        "verify · trial attempt 1/2 · hello · oracle",
        "teardown · trial attempt 1/2 · hello · oracle",
        "store result · submitted · reward 1.000",
    ]


async def test_search_attributes_set_at_start_and_upserted_at_end(client, harness):
    _, shared = harness
    spec = _spec(step=7)
    await batch.run(client, [spec], task_queue=shared)
    [trial] = await batch.list_trials(client, spec.batch_id)
    assert (trial.workflow_id, trial.task, trial.status) == (
        spec.trial_id,
        "hello",
        "COMPLETED",
    )
    assert (trial.reward, trial.termination) == (1.0, "submitted")
    # Whether the reward is valid (an invalid one is not a 0) and its components, for `status`.
    assert trial.reward_valid is True and trial.rewards == {"reward": 1.0}
    step = [wf async for wf in client.list_workflows(f'TrialStep = 7 AND TrialBatchId = "{spec.batch_id}"')]
    assert [wf.id for wf in step] == [spec.trial_id]


async def test_lost_host_starts_a_new_attempt_and_lists_both(client, harness):
    fake, shared = harness
    fake.setup_queues = [DEAD_QUEUE]  # attempt 1's worker never answers
    [result] = await batch.run(client, [_spec(host_schedule_timeout_s=4)], task_queue=shared)
    assert result.error is None and result.attempts == 2 and result.reward == 1.0
    assert result.termination_reason == "submitted"
    # The lost attempt keeps its checkpoint prefix, the second its final trajectory.
    assert result.trajectory_uris == [
        f"file:///store/{result.trial_id}/attempt-1/checkpoints/",
        f"file:///store/{result.trial_id}/attempt-2/trajectory.npz",
    ]
    # Attempt 1 was fenced on the shared queue; its teardown went to the shared queue only
    # (in the background), never to the lost host's queue.
    assert ("fence", shared, 1) in fake.calls and ("teardown", shared, 1) in fake.calls
    assert [f.host_queue for f in fake.fenced] == [DEAD_QUEUE]
    assert result.attempt_records[0].fenced and result.attempt_records[0].host_queue == DEAD_QUEUE
    assert not result.attempt_records[1].fenced
    # Attempt 2 replays what attempt 1 recorded; the result counts replayed and generated turns.
    assert [i.replay_from.attempt for i in fake.scaffold_inputs] == [1]
    assert fake.scaffold_inputs[0].replay_from == result.attempt_records[0]
    assert (result.turns, result.replayed_turns, result.generated_turns) == (3, 2, 1)


def _scheduled(history, converter) -> list[tuple[str, str, float]]:
    """(activity summary, task queue, seconds since the workflow started) of each activity
    scheduled, in order."""
    start = history.events[0].event_time.ToDatetime()
    return [
        (
            converter.from_payload(e.user_metadata.summary, str),
            e.activity_task_scheduled_event_attributes.task_queue.name,
            (e.event_time.ToDatetime() - start).total_seconds(),
        )
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


async def test_a_silent_host_is_fenced_and_the_next_attempt_never_waits_on_its_queue(client, harness):
    """Attempt 1's scaffold stops heartbeating (its host frozen). The workflow fences the
    attempt on the shared queue and schedules attempt 2's set-up right after, with nothing scheduled on attempt 1's host queue after the loss: before
    fencing, its teardown waited there first (2 min start-to-close, 120 s schedule-to-start),
    then the attempt backoff (2 s), which a fenced loss skips."""
    fake, shared = harness
    fake.hang_attempts = {1}
    spec = _spec(heartbeat_timeout_s=3, host_schedule_timeout_s=60)
    [handle] = await batch.submit(client, [spec], task_queue=shared)
    result = await batch.wait_one(handle, spec)
    assert (result.attempts, result.error, result.reward) == (2, None, 1.0)
    assert result.attempt_records[0].fenced and not result.attempt_records[0].complete
    history = await handle.fetch_history()
    timed_out = [e for e in history.events if e.HasField("activity_task_timed_out_event_attributes")]
    assert len(timed_out) == 1  # the silent scaffold, by its heartbeat
    lost_at = (
        timed_out[0].event_time.ToDatetime() - history.events[0].event_time.ToDatetime()
    ).total_seconds()
    scheduled = _scheduled(history, client.data_converter.payload_converter)
    after = [(summary.split(" · ")[0], queue, t) for summary, queue, t in scheduled if t >= lost_at]
    assert [(name, queue) for name, queue, _ in after[:3]] == [
        ("fence (" + fake.live_queue + ")", shared),
        ("teardown (fallback, host lost)", shared),
        ("setup", setup_queue(shared)),
    ], after
    assert not any(e.HasField("timer_started_event_attributes") for e in history.events)  # no backoff
    # The set-up of attempt 2 followed the loss by the fence's round trip; reported, not
    # asserted on (a timed assert): bench/failover.py measures it.
    print(f"loss -> attempt 2 set-up scheduled: {after[2][2] - lost_at:.2f} s")


async def test_every_attempt_lost_is_an_infra_error(client, harness):
    fake, shared = harness
    fake.setup_queues = [DEAD_QUEUE, DEAD_QUEUE]
    spec = _spec(attempt_limit=2, host_schedule_timeout_s=4)
    [result] = await batch.run(client, [spec], task_queue=shared)
    assert result.termination_reason == "infra_error" and result.attempts == 2
    assert result.error is not None and result.error.type == "ActivityTimeout.SCHEDULE_TO_START"
    # why, in words: which activity on which host queue, which timeout, what it means
    assert result.error.message == (
        f"attempt 2 lost: the scaffold activity on {DEAD_QUEUE} was not picked up within 4 s: no "
        "worker polls that host's queue (its worker stopped or lost the Temporal server)"
    ), result.error.message
    assert len(result.trajectory_uris) == 2


async def test_non_retryable_setup_error_fails_fast_with_error_recorded(client, harness):
    fake, shared = harness
    fake.setup_error = ApplicationError("Dockerfile broke", type="ImageBuildFailed", non_retryable=True)
    [result] = await batch.run(client, [_spec()], task_queue=shared)
    assert [c[0] for c in fake.calls] == ["setup"]  # no retry, no other phase
    assert result.termination_reason == "setup_error"  # the task's set-up, not its verifier
    assert result.error is not None
    assert (result.error.type, result.error.phase, result.error.non_retryable) == (
        "ImageBuildFailed",
        "setup",
        True,
    )
    assert fake.stored[0].result.error == result.error  # stored as data too


async def test_agent_timeout_is_an_outcome_and_still_verified(client, harness):
    fake, shared = harness
    fake.scaffold_termination = "timeout"
    [result] = await batch.run(client, [_spec()], task_queue=shared)
    assert result.termination_reason == "timeout" and result.error is None
    assert "verify" in [c[0] for c in fake.calls] and result.reward_valid


def _three_steps(fake: FakeTrial, strategy: str | None = None, gate: float | None = None) -> None:
    fake.strategy = strategy
    fake.steps = [
        StepPlan(name=n, index=i, agent_timeout_s=20 + i, verifier_timeout_s=5 + i, min_reward=gate)
        for i, n in enumerate(["a", "b", "c"], start=1)
    ]


async def test_steps_run_in_order_in_one_sandbox_with_their_own_timeouts(client, harness):
    fake, shared = harness
    _three_steps(fake)
    fake.step_rewards = {"a": {"reward": 1.0}, "b": {"reward": 0.5, "style": 1.0}, "c": {"reward": 0.0}}
    [result] = await batch.run(client, [_spec()], task_queue=shared)
    names = [n for n, _, _ in fake.calls]
    assert names == [
        "setup",
        *[f"{phase} {s}" for s in "abc" for phase in ("step_setup", "scaffold", "verify")],
        "teardown",
    ]
    assert [i.agent_timeout_s for i in fake.scaffold_inputs] == [21, 22, 23]
    assert {i.sandbox_id for i in fake.scaffold_inputs} == {"sb-1"}
    assert [(s.name, s.reward, s.stopped) for s in result.step_results] == [
        ("a", 1.0, None),
        ("b", 0.5, None),
        ("c", 0.0, None),
    ]
    # mean (the default): per key, a missing key counting 0
    assert result.rewards == {"reward": 0.5, "style": pytest.approx(1 / 3)}
    assert result.reward == 0.5 and result.reward_valid and result.turns == 9
    assert result.timings["step_setup"] > 0
    assert fake.stored[0].result.step_results == result.step_results


async def test_a_failed_min_reward_gate_stops_the_later_steps(client, harness):
    fake, shared = harness
    _three_steps(fake, strategy="final", gate=1.0)
    fake.step_rewards = {"a": {"reward": 1.0}, "b": {"reward": 0.25}}
    [result] = await batch.run(client, [_spec()], task_queue=shared)
    assert "scaffold c" not in [n for n, _, _ in fake.calls]
    assert [(s.name, s.stopped) for s in result.step_results] == [
        ("a", None),
        ("b", "reward=0.25 below min_reward 1"),
    ]
    assert (result.reward, result.reward_valid, result.termination_reason) == (0.25, True, "submitted")
    assert result.multi_step_reward_strategy == "final"


async def test_a_step_without_a_valid_reward_stops_and_is_left_out_of_the_mean(client, harness):
    fake, shared = harness
    _three_steps(fake)
    fake.step_rewards = {"a": {"reward": 0.5}, "b": None}
    [result] = await batch.run(client, [_spec()], task_queue=shared)
    assert [(s.name, s.reward_valid, s.stopped) for s in result.step_results] == [
        ("a", True, None),
        ("b", False, "no valid reward"),
    ]
    assert (result.reward, result.reward_valid) == (0.5, True)


async def test_a_failed_step_setup_stops_before_its_agent(client, harness):
    fake, shared = harness
    _three_steps(fake, strategy="final")
    fake.failing_step_setups = {"b"}
    [result] = await batch.run(client, [_spec()], task_queue=shared)
    assert [n for n, _, _ in fake.calls][-2:] == ["step_setup b", "teardown"]
    b = result.step_results[-1]
    assert (b.name, b.termination_reason, b.error.type, b.stopped) == (
        "b",
        None,
        "StepSetupFailed",
        "step set-up failed",
    )
    # "final": the last step that ran has no reward, so neither has the trial
    assert (result.reward_valid, result.termination_reason) == (False, "setup_error")
    assert "b: setup.sh exited 1" in (result.reward_error or "")


async def test_a_lost_host_restarts_the_steps_from_the_first_live(client, harness):
    fake, shared = harness
    _three_steps(fake)
    fake.setup_queues = [DEAD_QUEUE]  # attempt 1's worker never answers its first step
    [result] = await batch.run(client, [_spec(host_schedule_timeout_s=4)], task_queue=shared)
    assert result.attempts == 2 and result.error is None and result.reward == 1.0
    assert [s.name for s in result.step_results] == ["a", "b", "c"]  # the finishing attempt's
    assert [(n, a) for n, _, a in fake.calls if n.startswith("scaffold")] == [
        ("scaffold a", 2),
        ("scaffold b", 2),
        ("scaffold c", 2),
    ]
    assert all(i.replay_from is None for i in fake.scaffold_inputs)  # steps run live
    assert result.attempt_records[1].complete and result.attempt_records[1].trajectory_uri is None


async def test_cancel_tears_down_and_completes_cancelled(client, harness):
    fake, shared = harness
    fake.scaffold_delay_s = 30
    spec = _spec()
    [handle] = await batch.submit(client, [spec], task_queue=shared)
    await wait_until(lambda: any(c[0] == "scaffold" for c in fake.calls), what="the scaffold phase")
    progress = await handle.query(TrialWorkflow.progress)
    assert progress.phase == "scaffold" and progress.attempt == 1
    await handle.cancel()
    result = await batch.wait_one(handle, spec)
    assert result.termination_reason == "cancelled"
    assert ("teardown", fake.live_queue, 1) in fake.calls


async def test_resubmitting_a_batch_attaches_instead_of_duplicating(client, harness):
    fake, shared = harness
    spec = _spec()
    [first] = await batch.run(client, [spec], task_queue=shared)
    [second] = await batch.run(client, [spec], task_queue=shared)
    assert first == second
    assert [c[0] for c in fake.calls].count("setup") == 1
    runs = [wf async for wf in client.list_workflows(f'WorkflowId = "{spec.trial_id}"')]
    assert len(runs) == 1 and runs[0].status == WorkflowExecutionStatus.COMPLETED


def _lost_host(fake: FakeTrial) -> dict:
    fake.setup_queues = [DEAD_QUEUE]
    return {"host_schedule_timeout_s": 4}


def _non_retryable(fake: FakeTrial) -> dict:
    fake.setup_error = ApplicationError("Dockerfile broke", type="ImageBuildFailed", non_retryable=True)
    return {}


def _agent_timeout(fake: FakeTrial) -> dict:
    fake.scaffold_termination = "timeout"
    return {}


def _cancel(fake: FakeTrial) -> dict:
    fake.scaffold_delay_s = 30
    return {}


def _multi_step(fake: FakeTrial) -> dict:
    fake.steps = [
        StepPlan(name="one", index=1, agent_timeout_s=20, verifier_timeout_s=5, min_reward=1.0),
        StepPlan(name="two", index=2, agent_timeout_s=10, verifier_timeout_s=6),
    ]
    return {}


# One recorded history per workflow path: file stem -> (set the fakes up, expected termination).
PATHS = {
    "multi_step": (_multi_step, "submitted"),  # recorded before the step-rewards memo
    # the same path since workflow.patched("step-rewards-memo"): `status` shows the steps
    "multi_step_status_memo": (_multi_step, "submitted"),
    "success": (lambda fake: {}, "submitted"),
    "two_attempts_lost_host": (_lost_host, "submitted"),  # recorded before resume by replay
    # the same path since workflow.patched("replay-lost-attempt"): attempt 2 replays attempt 1
    "two_attempts_lost_host_replayed": (_lost_host, "submitted"),
    # since workflow.patched("fenced-failover"): attempt 1 fenced, its teardown in the background
    "two_attempts_lost_host_fenced": (_lost_host, "submitted"),
    "non_retryable_setup_error": (_non_retryable, "setup_error"),
    "cancelled": (_cancel, "cancelled"),
    "agent_timeout": (_agent_timeout, "timeout"),
    # since workflow.patched("outcome-search-attribute"): TrialOutcome upserted at the end
    "success_outcome": (lambda fake: {}, "submitted"),
}


@pytest.mark.parametrize("name", sorted(PATHS))
async def test_each_path_records_a_history_that_replays(client, harness, name):
    """Determinism guard for histories recorded now; ``TRIALFLOW_RECORD_HISTORY=1`` refreshes
    the checked-in one of this path (only for an intended, versioned change: see
    workflows/trial.py on ``workflow.patched``)."""
    fake, shared = harness
    arrange, termination = PATHS[name]
    spec = _spec(**arrange(fake))
    [handle] = await batch.submit(client, [spec], task_queue=shared)
    if name == "cancelled":
        await wait_until(lambda: any(c[0] == "scaffold" for c in fake.calls), what="the scaffold phase")
        await handle.cancel()
    result = await batch.wait_one(handle, spec)
    assert result.termination_reason == termination
    history = await handle.fetch_history()
    replayed = await Replayer(
        workflows=[TrialWorkflow], data_converter=client.data_converter
    ).replay_workflow(history)
    assert replayed.replay_failure is None
    if os.environ.get("TRIALFLOW_RECORD_HISTORY"):
        (HISTORIES / f"{name}.json").write_text(history.to_json())


def test_every_path_has_a_checked_in_history():
    assert sorted(p.stem for p in HISTORIES.glob("*.json")) == sorted(PATHS)


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("*.json")), ids=lambda p: p.stem)
def test_checked_in_history_replays_against_current_code(path):
    """Histories recorded by earlier versions of TrialWorkflow (tests/workflows/histories/) must
    replay: a change to the command sequence that breaks one needs ``workflow.patched`` (see
    workflows/trial.py). A history recorded by the same code in the same run could not catch
    that; these were recorded once and checked in."""
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    assert len(history.events) > 10  # a whole trial, not a stub
    replayer = Replayer(workflows=[TrialWorkflow], data_converter=pydantic_data_converter)
    result = asyncio.run(replayer.replay_workflow(history, raise_on_replay_failure=False))
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
