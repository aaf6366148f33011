"""The official Anthropic and OpenAI SDKs against the proxy over the scripted vLLM double.

Each test runs a tool-call round trip (model calls Bash, client returns the result, model
answers), non-streaming and streaming (the SDK's stream accumulator must give the same
final message), and checks the recorded trajectory: one main segment that the second turn
extends, mask 1 on exactly the generated tokens.
"""

from __future__ import annotations

import asyncio

import aiohttp
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


# Long enough for the hold to be the only thing between the request and its answer (several
# keepalive_s of 0.1 s below), short enough that nine such tests stay a short loop.
OUTAGE_S = 0.6


async def _after_an_outage(dbl: ScriptedVLLM, request, seconds: float = OUTAGE_S):
    """Run ``request()`` while ``dbl`` (the only replica) is down, bring it back after
    ``seconds``; returns what the request returned and how long it waited."""
    port = dbl.port
    await dbl.stop()
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.create_task(request())
    await asyncio.sleep(seconds)
    assert not task.done()  # held, no error yet
    await dbl.start(port)
    out = await asyncio.wait_for(task, 30)
    return out, loop.time() - started


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("protocol", ["anthropic", "openai", "responses"])
async def test_an_outage_during_a_turn_is_held_and_the_sdk_sees_only_the_answer(tok, protocol, stream):
    """The replica is down when the turn arrives and back OUTAGE_S later: the proxy holds the
    turn (streams get keep-alive pings every 0.1 s), the official SDK gets the model's
    answer and no error; the session counts the hold, no infrastructure error."""
    async with ScriptedVLLM(tok, default=Reply("There are two files.")) as dbl:
        async with proxy_server(tok, dbl.url, outage_hold_s=30, keepalive_s=0.1) as srv:
            h = srv.open_session()
            msgs = [{"role": "user", "content": "What files are here?"}]
            if protocol == "anthropic":
                client = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="k", max_retries=0)

                async def ask():
                    m = await ask_anthropic(client, msgs, stream=stream, model="m", max_tokens=50)
                    return m.content[0].text
            elif protocol == "responses":  # Codex's API
                client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="k", max_retries=0)

                async def ask():
                    if not stream:
                        return (
                            await client.responses.create(model="m", input=msgs[0]["content"])
                        ).output_text
                    async with client.responses.stream(model="m", input=msgs[0]["content"]) as s:
                        return (await s.get_final_response()).output_text
            else:
                client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="k", max_retries=0)

                async def ask():
                    if not stream:
                        r = await client.chat.completions.create(model="m", messages=msgs)
                        return r.choices[0].message.content
                    async with client.chat.completions.stream(model="m", messages=msgs) as s:
                        return (await s.get_final_completion()).choices[0].message.content

            text, waited = await _after_an_outage(dbl, ask)
            assert text == "There are two files." and waited >= OUTAGE_S
            c = srv.session(h.session_id).trajectory.counters
            assert (c.turns, c.outage_holds, c.infra_errors) == (1, 1, 0)
            await client.close()


@pytest.mark.parametrize("protocol", ["anthropic", "openai", "responses"])
async def test_a_held_stream_carries_protocol_keepalives_then_the_answer(tok, protocol):
    """What the SDKs above tolerated, on the wire: Anthropic ``event: ping`` events, OpenAI
    SSE comment lines, every keepalive_s while the turn is held, then the normal events."""
    async with ScriptedVLLM(tok, default=Reply("back")) as dbl:
        async with proxy_server(tok, dbl.url, outage_hold_s=30, keepalive_s=0.1) as srv:
            h = srv.open_session()
            msgs = [{"role": "user", "content": "hi"}]
            if protocol == "anthropic":
                url, body = (
                    f"{h.anthropic_base_url}/v1/messages",
                    {"model": "m", "max_tokens": 20, "stream": True},
                )
            elif protocol == "responses":
                url, body = f"{h.openai_base_url}/responses", {"model": "m", "stream": True, "input": "hi"}
            else:
                url, body = f"{h.openai_base_url}/chat/completions", {"model": "m", "stream": True}
            if protocol != "responses":
                body["messages"] = msgs

            async def raw():
                async with aiohttp.ClientSession() as http, http.post(url, json=body) as r:
                    return r.status, await r.text()

            (status, text), _ = await _after_an_outage(dbl, raw, seconds=1.0)  # ~10 keepalives
    assert status == 200
    if protocol == "anthropic":
        assert text.count("event: ping\n") >= 5
        assert "event: message_stop" in text and "back" in text
    elif protocol == "responses":
        assert text.count(": keep-alive\n\n") >= 5
        assert "event: response.completed" in text and "back" in text
    else:
        assert text.count(": keep-alive\n\n") >= 5
        assert text.rstrip().endswith("data: [DONE]") and "back" in text


@pytest.mark.parametrize("protocol", ["anthropic", "openai"])
async def test_past_the_hold_the_turn_fails_as_infrastructure_and_the_session_stops(tok, protocol):
    """No replica within the hold: the client gets the protocol's retryable overload/503
    (never a 400 the model would react to), counted as an infrastructure error; with
    infra_ends_session the next request fails at once (the attempt is retried anyway)."""
    async with ScriptedVLLM(tok) as dbl:
        await dbl.stop()
        async with proxy_server(tok, dbl.url, outage_hold_s=0.5, infra_ends_session=True) as srv:
            h = srv.open_session()
            msgs = [{"role": "user", "content": "hi"}]
            loop = asyncio.get_running_loop()
            for attempt in range(2):
                started = loop.time()
                if protocol == "anthropic":
                    client = anthropic.AsyncAnthropic(
                        base_url=h.anthropic_base_url, api_key="k", max_retries=0
                    )
                    with pytest.raises(anthropic.APIStatusError) as exc:
                        await client.messages.create(model="m", max_tokens=5, messages=msgs)
                    assert (
                        exc.value.status_code == 529 and exc.value.body["error"]["type"] == "overloaded_error"
                    )
                else:
                    client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="k", max_retries=0)
                    with pytest.raises(openai.InternalServerError) as oexc:
                        await client.chat.completions.create(model="m", messages=msgs)
                    assert oexc.value.status_code == 503
                took = loop.time() - started
                assert took >= 0.5 if attempt == 0 else took < 0.5
                await client.close()
            c = srv.session(h.session_id).trajectory.counters
            assert (c.turns, c.outage_holds, c.infra_errors) == (0, 1, 2)
