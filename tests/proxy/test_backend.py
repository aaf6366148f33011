"""VLLMClient against the scripted vLLM double: body fields, parsing, error mapping."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.backend import (
    BackendProtocolError,
    CompletionRequest,
    VLLMClient,
    build_body,
    decode_routed_experts,
    encode_routed_experts,
    is_retryable,
    parse_completion,
)
from proxy.chat import SamplingParams
from proxy.errors import BackendHTTPError, ReplicaUnreachable
from tests.doubles.scripted_vllm import (
    Abort,
    Drop,
    HTTPFailure,
    Reply,
    ScriptedVLLM,
    fake_experts,
    fake_logprob,
)


def _req(prompt=(5, 6, 7), max_tokens=32, **sampling) -> CompletionRequest:
    return CompletionRequest(
        model="scripted", prompt_ids=list(prompt), max_tokens=max_tokens, sampling=SamplingParams(**sampling)
    )


def test_body_has_token_in_token_out_fields():
    body = build_body(_req(max_tokens=9, temperature=0.5, top_p=0.9, top_k=20, seed=3, stop=("END",)))
    assert body == {
        "model": "scripted",
        "prompt": [5, 6, 7],
        "max_tokens": 9,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 3,
        "stop": ["END"],
        "logprobs": 1,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "stream": False,
    }
    plain = build_body(_req())
    assert "top_k" not in plain and "seed" not in plain and "stop" not in plain


def test_routed_experts_roundtrip_and_rejects_garbage():
    arr = fake_experts(7, 2, 2, 8)
    assert np.array_equal(decode_routed_experts(encode_routed_experts(arr)), arr)
    with pytest.raises(BackendProtocolError):
        decode_routed_experts("not base64!")
    with pytest.raises(BackendProtocolError):
        decode_routed_experts(encode_routed_experts(np.zeros((3, 2))))


async def test_complete_parses_ids_logprobs_experts(tok):
    async with ScriptedVLLM(tok, script=[Reply("hello world", experts=(2, 2, 8))]) as dbl:
        client = VLLMClient(dbl.url)
        gen = await client.complete(_req())
        await client.close()
    expected = tok.encode("hello world", add_special_tokens=False) + [
        tok.convert_tokens_to_ids(tok.eos_token)
    ]
    assert gen.token_ids == expected
    assert gen.prompt_token_ids == [5, 6, 7]
    assert gen.logprobs == [fake_logprob(t, 3 + i) for i, t in enumerate(expected)]
    assert gen.finish_reason == "stop" and gen.replica == dbl.url
    assert gen.routed_experts.shape == (3 + len(expected) - 1, 2, 2)
    assert dbl.requests[0]["prompt"] == [5, 6, 7] and dbl.requests[0]["return_token_ids"] is True


async def test_length_and_abort_finish_reasons(tok):
    async with ScriptedVLLM(tok, script=[Reply("one two three four five"), Abort("one")]) as dbl:
        client = VLLMClient(dbl.url)
        length = await client.complete(_req(max_tokens=2))
        aborted = await client.complete(_req())
        await client.close()
    assert length.finish_reason == "length" and len(length.token_ids) == 2
    assert aborted.finish_reason == "abort" and aborted.token_ids == tok.encode(
        "one", add_special_tokens=False
    )


async def test_error_mapping(tok):
    async with ScriptedVLLM(
        tok, script=[HTTPFailure(500, "engine dead"), HTTPFailure(400, "bad prompt"), Drop()]
    ) as dbl:
        client = VLLMClient(dbl.url)
        with pytest.raises(BackendHTTPError) as e5:
            await client.complete(_req())
        assert e5.value.upstream_status == 500 and is_retryable(e5.value) and "engine dead" in str(e5.value)
        with pytest.raises(BackendHTTPError) as e4:
            await client.complete(_req())
        assert (
            e4.value.upstream_status == 400 and not is_retryable(e4.value) and "bad prompt" in str(e4.value)
        )
        with pytest.raises(ReplicaUnreachable):
            await client.complete(_req())
        await client.close()
        url = dbl.url
    refused = VLLMClient(url)
    with pytest.raises(ReplicaUnreachable):
        await refused.complete(_req())
    assert not await refused.healthy()
    await refused.close()


async def test_timeout_is_replica_unavailable(tok):
    async with ScriptedVLLM(tok, script=[Reply("slow", delay_s=2.0)]) as dbl:
        client = VLLMClient(dbl.url, timeout_s=0.3)
        with pytest.raises(ReplicaUnreachable):
            await client.complete(_req())
        await client.close()


def test_parse_rejects_contract_breaks():
    ok = {
        "choices": [
            {
                "token_ids": [1, 2],
                "prompt_token_ids": [5, 6, 7],
                "finish_reason": "stop",
                "logprobs": {"token_logprobs": [-0.1, -0.2]},
            }
        ]
    }
    assert parse_completion(ok, _req()).token_ids == [1, 2]
    top_level = {"prompt_token_ids": [5, 6, 7], "choices": [dict(ok["choices"][0], prompt_token_ids=None)]}
    assert parse_completion(top_level, _req()).logprobs == [-0.1, -0.2]
    for broken in (
        {"choices": []},
        {"choices": [dict(ok["choices"][0], prompt_token_ids=[9])]},
        {"choices": [dict(ok["choices"][0], finish_reason=None)]},
        {"choices": [dict(ok["choices"][0], logprobs={"token_logprobs": [-0.1]})]},
        {"choices": [dict(ok["choices"][0], logprobs=None)]},
    ):
        with pytest.raises(BackendProtocolError):
            parse_completion(broken, _req())


def test_body_encodes_an_int32_array_prompt_like_a_list():
    import json as stdjson

    from proxy import jsonio
    from proxy.backend import build_body
    from proxy.trajectory import id_array

    ids = [0, 5, 2**31 - 1, 151643]
    as_array = stdjson.loads(jsonio.dumps(build_body(CompletionRequest("m", id_array(ids), 8))))
    as_list = stdjson.loads(jsonio.dumps(build_body(CompletionRequest("m", ids, 8))))
    assert as_array == as_list and as_array["prompt"] == ids
    assert stdjson.loads(jsonio.dumps(build_body(CompletionRequest("m", id_array([]), 8))))["prompt"] == []


def test_echo_equal_to_the_sent_bytes_is_dropped_unparsed():
    import json as stdjson

    from proxy.backend import drop_verified_echo

    sent = b"[5,6,7]"
    choice = '{"choices":[{"text":"\\"prompt_token_ids\\":[5,6,7]","prompt_token_ids":%s,"token_ids":[9]}]}'
    raw, ok = drop_verified_echo((choice % "[5,6,7]").encode(), sent)
    assert ok and stdjson.loads(raw)["choices"][0]["prompt_token_ids"] is None
    assert stdjson.loads(raw)["choices"][0]["text"] == '"prompt_token_ids":[5,6,7]'  # strings untouched
    for other in ("[5,6,7,8]", "[5, 6, 7]", "[5,6]", "[4,6,7]"):  # longer, spaced, shorter, different
        raw, ok = drop_verified_echo((choice % other).encode(), sent)
        assert not ok and stdjson.loads(raw)["choices"][0]["prompt_token_ids"] == stdjson.loads(other)


async def test_a_different_compact_echo_is_still_a_protocol_error(tok):
    """The byte shortcut only ever accepts; a mismatch goes the parsed way and is caught."""
    from aiohttp import web

    async def handler(request):
        body = (
            b'{"choices":[{"text":"x","token_ids":[9],"prompt_token_ids":[5,6,8],"finish_reason":"stop",'
            b'"logprobs":{"token_logprobs":[-0.5]}}]}'
        )
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = VLLMClient(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")
    with pytest.raises(BackendProtocolError, match="different prompt"):
        await client.complete(_req(prompt=(5, 6, 7)))
    assert client.echo_checks == {"bytes": 0, "parsed": 1}
    await client.close()
    await runner.cleanup()


@pytest.mark.vllm
async def test_real_vllm_echo_is_checked_by_bytes(vllm_url, vllm_model_name, tok):
    """vLLM writes compact JSON: its echo matches the sent bytes, so the shortcut is live."""
    client = VLLMClient(vllm_url)
    prompt = tok.encode("hello there, general", add_special_tokens=False)
    gen = await client.complete(CompletionRequest(vllm_model_name, prompt, 4, SamplingParams(seed=1)))
    await client.close()
    assert client.echo_checks == {"bytes": 1, "parsed": 0}
    assert list(gen.prompt_token_ids) == prompt and len(gen.token_ids) == len(gen.logprobs) > 0


def test_body_with_a_pre_encoded_prompt_is_the_same_json():
    import json as stdjson

    from proxy import jsonio
    from proxy.backend import encode_prompt
    from proxy.trajectory import id_array

    req = CompletionRequest("m", id_array([3, 1, 4, 1, 5]), 8, SamplingParams(stop=("</s>",), seed=3))
    plain = stdjson.loads(jsonio.dumps(build_body(req)))
    assert stdjson.loads(jsonio.dumps(build_body(req, encode_prompt(req.prompt_ids)))) == plain
