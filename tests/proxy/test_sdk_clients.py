"""The official Anthropic and OpenAI SDKs against the proxy over the scripted vLLM double.

Each test runs a tool-call round trip (model calls Bash, client returns the result, model
answers), non-streaming and streaming (the SDK's stream accumulator must give the same
final message), and checks the recorded trajectory: one main segment that the second turn
extends, mask 1 on exactly the generated tokens.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import (
    ANTHROPIC_AGENT_KWARGS,
    BASH_TOOL_CALL,
    OPENAI_TOOLS,
    ask_anthropic,
    proxy_server,
)

THINK_THEN_CALL = "<think>\nI should list the files.\n</think>\n\n" + BASH_TOOL_CALL


def _check_trajectory(srv, session_id, dbl, tok):
    traj = srv.session(session_id).trajectory
    (seg,) = traj.segments
    assert seg.kind == "main" and traj.counters.turns == 2 and traj.counters.tool_calls == 1
    p1, p2 = (r["prompt"] for r in dbl.requests)
    assert seg.prompt_ids.tolist() == p1 and seg.full_ids[: len(p2)] == p2  # turn 2 extends turn 1
    generated = [t for t, m in zip(seg.response_ids, seg.response_mask, strict=False) if m]
    eos = [tok.eos_token_id]
    expected = tok.encode(THINK_THEN_CALL, add_special_tokens=False) + eos
    expected += tok.encode("There are two files.", add_special_tokens=False) + eos
    assert generated == expected
    assert (
        seg.response_ids[: traj.turns[0].completion_tokens].tolist()
        == expected[: traj.turns[0].completion_tokens]
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_tool_round_trip(tok, stream):
    async with ScriptedVLLM(tok, script=[Reply(THINK_THEN_CALL), Reply("There are two files.")]) as dbl:
        async with proxy_server(tok, dbl.url) as srv:
            h = srv.open_session()
            client = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="dummy", max_retries=0)
            messages = [{"role": "user", "content": "What files are here?"}]

            async def ask(msgs):
                return await ask_anthropic(client, msgs, stream=stream, **ANTHROPIC_AGENT_KWARGS)

            first = await ask(messages)
            assert [b.type for b in first.content] == ["thinking", "tool_use"]
            assert first.content[0].thinking == "I should list the files."
            call = first.content[1]
            assert (call.name, call.input, first.stop_reason) == ("Bash", {"command": "ls"}, "tool_use")
            assert call.id.startswith("toolu_")
            messages += [
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "a.txt b.txt"}],
                },
            ]
            second = await ask(messages)
            assert second.content[0].text == "There are two files." and second.stop_reason == "end_turn"
            assert second.usage.input_tokens == len(dbl.requests[1]["prompt"])
            _check_trajectory(srv, h.session_id, dbl, tok)
            await client.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_sdk_tool_round_trip(tok, stream):
    async with ScriptedVLLM(tok, script=[Reply(THINK_THEN_CALL), Reply("There are two files.")]) as dbl:
        async with proxy_server(tok, dbl.url) as srv:
            h = srv.open_session()
            client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
            messages = [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "What files are here?"},
            ]

            async def ask(msgs):
                if not stream:
                    r = await client.chat.completions.create(
                        model="gpt-test", messages=msgs, tools=OPENAI_TOOLS
                    )
                    return r.choices[0].message, r.choices[0].finish_reason
                async with client.chat.completions.stream(
                    model="gpt-test", messages=msgs, tools=OPENAI_TOOLS
                ) as s:
                    final = await s.get_final_completion()
                return final.choices[0].message, final.choices[0].finish_reason

            msg, finish = await ask(messages)
            assert finish == "tool_calls" and msg.content in (None, "")
            (call,) = msg.tool_calls
            assert call.function.name == "Bash" and call.function.arguments == '{"command": "ls"}'
            assert msg.model_extra.get("reasoning_content") == "I should list the files."
            messages += [
                msg.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "a.txt b.txt"},
            ]
            msg2, finish2 = await ask(messages)
            assert (msg2.content, finish2) == ("There are two files.", "stop")
            _check_trajectory(srv, h.session_id, dbl, tok)
            await client.close()


async def test_anthropic_sdk_error_shapes(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url, max_context_tokens=20) as srv:
        h = srv.open_session()
        client = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="dummy", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
            await client.messages.create(
                model="m", max_tokens=10, messages=[{"role": "user", "content": "x " * 50}]
            )
        bad = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url + "x", api_key="dummy", max_retries=0)
        with pytest.raises(anthropic.NotFoundError):
            await bad.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
        await client.close()
        await bad.close()
