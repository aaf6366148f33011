"""The official openai SDK's ``client.responses`` against the proxy over the scripted vLLM double.

A tool-call round trip the way the Codex CLI runs it (``store=False``, the whole history as
``input`` every time, the model's reasoning and call items resent as they came back),
non-streaming and streaming (the SDK's stream accumulator must give the same response),
and the recorded trajectory: one main segment the second turn extends, mask 1 on exactly
the generated tokens.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import BASH_TOOL_CALL, proxy_server

THINK_THEN_CALL = "<think>\nI should list the files.\n</think>\n\n" + BASH_TOOL_CALL
TOOLS = [
    {
        "type": "function",
        "name": "Bash",
        "description": "Run a shell command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
        "strict": False,
    },
    {"type": "web_search", "external_web_access": True},  # hosted: skipped and noted
]
CODEX_FIELDS = dict(
    store=False,
    include=["reasoning.encrypted_content"],
    reasoning={"summary": "auto"},
    parallel_tool_calls=True,
    prompt_cache_key="thread-1",
    tool_choice="auto",
)


def _item_dicts(response) -> list[dict]:
    """The output items as a client resends them."""
    return [item.model_dump(exclude_none=True) for item in response.output]


async def _ask(client, stream: bool, items: list[dict]):
    kwargs = dict(model="gpt-test", instructions="", input=items, tools=TOOLS, **CODEX_FIELDS)
    if not stream:
        return await client.responses.create(**kwargs)
    async with client.responses.stream(**kwargs) as s:
        seen = [event.type async for event in s]
        final = await s.get_final_response()
    assert seen[:2] == ["response.created", "response.in_progress"] and seen[-1] == "response.completed"
    return final


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses_tool_round_trip(tok, stream, caplog):
    caplog.set_level("INFO", logger="proxy.session")
    async with ScriptedVLLM(tok, script=[Reply(THINK_THEN_CALL), Reply("There are two files.")]) as dbl:
        async with proxy_server(tok, dbl.url) as srv:
            h = srv.open_session()
            client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
            items: list[dict] = [
                {
                    "type": "message",
                    "role": "developer",
                    "content": [{"type": "input_text", "text": "Be brief."}],
                },
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What files?"}],
                },
            ]
            first = await _ask(client, stream, items)
            assert [o.type for o in first.output] == ["reasoning", "function_call"]
            assert first.status == "completed" and first.object == "response" and first.id.startswith("resp_")
            assert first.output[0].content[0].text == "I should list the files."
            call = first.output[1]
            assert (call.name, json.loads(call.arguments)) == ("Bash", {"command": "ls"})
            assert first.usage.input_tokens == len(dbl.requests[0]["prompt"])
            items += _item_dicts(first)
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt b.txt"})
            second = await _ask(client, stream, items)
            assert second.output_text == "There are two files."
            assert [o.type for o in second.output] == ["message"]
            traj = srv.session(h.session_id).trajectory
            (seg,) = traj.segments
            assert seg.kind == "main" and traj.counters.turns == 2 and traj.counters.tool_calls == 1
            p1, p2 = (r["prompt"] for r in dbl.requests)
            assert seg.full_ids[: len(p2)] == p2  # turn 2 extends turn 1: the model's tokens kept
            generated = [t for t, m in zip(seg.response_ids, seg.response_mask, strict=True) if m]
            eos = [tok.eos_token_id]
            expected = tok.encode(THINK_THEN_CALL, add_special_tokens=False) + eos
            expected += tok.encode("There are two files.", add_special_tokens=False) + eos
            assert generated == expected
            noted = " ".join(
                r.getMessage() for r in caplog.records if "ignoring request fields" in r.getMessage()
            )
            for name in ("tools[].type=web_search", "store", "include", "prompt_cache_key", "input[].id"):
                assert repr(name) in noted  # accepted and noted, not silently dropped
            await client.close()


async def test_openai_responses_errors_are_sdk_exceptions(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url, max_context_tokens=20) as srv:
        h = srv.open_session()
        client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
        with pytest.raises(openai.BadRequestError) as too_long:
            await client.responses.create(model="m", input="x " * 50)
        assert too_long.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await client.responses.create(model="m", input="hi", previous_response_id="resp_1")
        with pytest.raises(openai.BadRequestError, match=r"input\[0\]\.type"):
            await client.responses.create(model="m", input=[{"type": "item_reference", "id": "x"}])
        with pytest.raises(openai.BadRequestError, match="images are not supported"):
            await client.responses.create(
                model="m",
                input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}],
            )
        bad = openai.AsyncOpenAI(base_url=h.openai_base_url + "x", api_key="dummy", max_retries=0)
        with pytest.raises(openai.NotFoundError):
            await bad.responses.create(model="m", input="hi")
        await client.close()
        await bad.close()
