"""The scaffold activity when the model is down, and under a token budget: REAL Temporal,
Docker, SeaweedFS and the worker's real proxy.

Model down (the trial's replica URL has nothing listening; the proxy holds each turn for
its outage hold, 1 s here, then answers 503): the agent saw infrastructure, so the activity
raises retryable `ReplicaUnavailable` whatever the agent then did (failed, or shrugged and
exited 0), the workflow starts new attempts, and when they run out the trial ends as
`infra_error` with that error recorded (not as a model failure with reward 0). Each
attempt's (empty) trajectory and scaffold log are still stored.

Token budget (`TrialSpec.max_response_tokens`, the scripted vLLM double as the replica):
the first turn is capped at the budget, the second is refused (`BudgetSpent`), and the
trial ends `overlong`, still verified.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from transformers import AutoTokenizer

from proxy.trajectory import Trajectory
from tests._worker_fixtures import worker_settings
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from trialflow import batch
from trialflow.cli._worker import WorkerProcess
from trialflow.scaffolds import (
    Scaffold,
    ScaffoldContext,
    ScaffoldResult,
    register_scaffold,
)
from trialflow.storage import TrialKeys, open_store

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "examples" / "tasks" / "create-file"

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]


class OneTurnScaffold(Scaffold):
    """Test scaffold: one chat turn through the proxy; exit 1 unless it answers 200."""

    name = "test-one-turn"
    needs_model = True
    runs_in_sandbox = False  # its client runs in the test process, on the host

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        started = time.monotonic()
        body = {"model": ctx.model, "messages": [{"role": "user", "content": "hi"}]}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{ctx.openai_base_url}/chat/completions", json=body) as resp,
        ):
            text = await resp.text()
        code = 0 if resp.status == 200 else self.exit_on_error
        return ScaffoldResult(code, False, "", f"HTTP {resp.status}: {text}", time.monotonic() - started)

    exit_on_error = 1


class ShruggingScaffold(OneTurnScaffold):
    """Test scaffold: as test-one-turn, but exits 0 whatever the proxy answered."""

    name = "test-one-turn-shrug"
    exit_on_error = 0


class TwoTurnScaffold(Scaffold):
    """Test scaffold: two chat turns (the second continues the first); exit 1 unless both
    answer 200. The log has each turn's status and body."""

    name = "test-two-turns"
    needs_model = True
    runs_in_sandbox = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        started = time.monotonic()
        messages = [{"role": "user", "content": "write the file"}]
        log, code = [], 0
        async with aiohttp.ClientSession() as http:
            for turn in ("first", "second"):
                body = {"model": ctx.model, "messages": messages, "max_tokens": 1000}
                async with http.post(f"{ctx.openai_base_url}/chat/completions", json=body) as resp:
                    text = await resp.text()
                log.append(f"{turn}: HTTP {resp.status}: {text}")
                if resp.status != 200:
                    code = 1
                    break
                reply = json.loads(text)["choices"][0]["message"]
                messages += [
                    {"role": "assistant", "content": reply["content"]},
                    {"role": "user", "content": "more"},
                ]
        return ScaffoldResult(code, False, "", "\n".join(log), time.monotonic() - started)


register_scaffold("test-one-turn", f"{__name__}:OneTurnScaffold")
register_scaffold("test-one-turn-shrug", f"{__name__}:ShruggingScaffold")
register_scaffold("test-two-turns", f"{__name__}:TwoTurnScaffold")


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_replicas_down_is_a_retried_infra_error_and_a_budget_ends_overlong(
    temporal_address, s3_endpoint, docker_client, tiny_model_dir
):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    async with ScriptedVLLM(tok, default=Reply("word " * 100)) as dbl:
        settings = worker_settings(
            "down",
            temporal_address,
            s3_endpoint,
            docker_client,
            model_dir=tiny_model_dir,
            replica_urls=[dbl.url],
            replica_outage_hold_s=1.0,
        )
        client = await batch.connect(temporal_address)
        dead = _dead_url()
        specs = [
            batch.make_specs(settings.task_queue, [TASK], name, attempt_limit=2, replicas=[dead])[0]
            for name in ("test-one-turn", "test-one-turn-shrug")
        ]
        budget = 8
        specs.append(
            batch.make_specs(
                settings.task_queue, [TASK], "test-two-turns", attempt_limit=1, max_response_tokens=budget
            )[0]
        )
        specs = [spec.model_copy(update={"sample_index": i}) for i, spec in enumerate(specs)]  # 3 trials
        async with WorkerProcess(settings, client) as process:
            results = await batch.run(client, specs, task_queue=settings.task_queue)
    store = open_store(settings)
    for spec, r in zip(specs[:2], results[:2], strict=True):
        # failed or exited 0: the agent saw infrastructure, so no attempt is its outcome
        assert r.termination_reason == "infra_error" and r.attempts == 2, (spec.scaffold, r)
        assert not r.reward_valid
        assert r.error is not None and r.error.type == "ReplicaUnavailable"
        assert "infrastructure error" in r.error.message
        assert r.error.phase == "scaffold" and not r.error.non_retryable
        for attempt in (1, 2):
            keys = TrialKeys(spec.batch_id, spec.trial_id, attempt)
            assert store.exists(keys.trajectory) and store.exists(keys.log("scaffold.log"))
            assert b"HTTP 503" in store.get_bytes(keys.log("scaffold.log"))
            traj = Trajectory.from_bytes(store.get_bytes(keys.trajectory))
            assert (traj.counters.outage_holds, traj.counters.infra_errors) == (1, 1)
    over = results[2]
    assert over.termination_reason == "overlong" and over.reward_valid and over.error is None, over
    assert len(dbl.requests) == 1 and dbl.requests[0]["max_tokens"] == budget  # the second was refused
    log = store.get_bytes(TrialKeys(specs[2].batch_id, specs[2].trial_id, 1).log("scaffold.log")).decode()
    assert "second: HTTP 400" in log and "budget_spent" in log
    traj = Trajectory.from_bytes(
        store.get_bytes(TrialKeys(specs[2].batch_id, specs[2].trial_id, 1).trajectory)
    )
    (seg,) = traj.segments
    assert len(seg.response_ids) == budget and traj.counters.overlong == 1
    left = docker_client.containers.list(
        all=True, filters={"label": f"trialflow.worker={process.host_queue}"}
    )
    assert not left, [c.name for c in left]
