"""Every family's reasoning and tool calls out through both protocols, with the real SDKs.

The real proxy server loads each family fixture from its directory (trialflow.families: the
family's tokens, its own template, its generation_config stop tokens), so the proxy detects
the family's profile and parsers itself; the scripted vLLM double emits the family's native
output (`FamilyFixture.native`, trialflow.families) ending in the family's stop token. For each family, protocol
and stream/non-stream: a tool loop (reasoning + calls, then a final answer with reasoning)
through the anthropic / openai SDK. Checked: the client gets the reasoning as a thinking
block / ``reasoning_content`` and the calls as ``tool_use`` blocks / ``tool_calls`` (the SDKs'
stream accumulators give the same as the non-streamed answer), no markup leaks into text,
nothing counts as a parse failure, and the record holds exactly the tokens the backend returned.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from proxy.chat import ParsedOutput, ToolCall
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import (
    ANTHROPIC_AGENT_KWARGS,
    ANTHROPIC_TOOLS,
    OPENAI_TOOLS,
    ask_anthropic,
    proxy_server,
)
from trialflow.families import FAMILIES, build_tokenizer_dir, family

FAMS = sorted(FAMILIES)
MARKUP = ("<tool_call>", "<think>", "</think>", "<|", "<｜", "<arg_", "<function=")


@pytest.fixture(scope="module")
def family_toks(tmp_path_factory, harmony_vocab):
    root = tmp_path_factory.mktemp("families")
    return {n: AutoTokenizer.from_pretrained(str(build_tokenizer_dir(n, root / n))) for n in FAMS}


def _script(name: str, tok) -> tuple[list[Reply], list[ParsedOutput]]:
    traits = family(name).traits
    commands = ["ls", "cat a.txt"][: 2 if traits.parallel_calls else 1]
    first = ParsedOutput(
        content="Let me look." if traits.text_with_calls else "",
        reasoning="I should list the files." if traits.reasoning else None,
        tool_calls=[ToolCall(f"c{i}", "Bash", {"command": c}) for i, c in enumerate(commands)],
    )
    second = ParsedOutput(
        content="There are two files.", reasoning="Both are listed." if traits.reasoning else None
    )
    replies = []
    for p in (first, second):
        text, stop = family(name).native(p)
        ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids(stop)]
        replies.append(Reply(token_ids=ids, eos=False))
    return replies, [first, second]


def _no_markup(text: str | None) -> None:
    assert not any(m in (text or "") for m in MARKUP), text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", FAMS)
async def test_anthropic_sdk_gets_thinking_and_tool_use(family_toks, name, stream):
    tok = family_toks[name]
    replies, (first_p, second_p) = _script(name, tok)
    async with ScriptedVLLM(tok, script=list(replies)) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        client = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="dummy", max_retries=0)

        async def ask(msgs):
            return await ask_anthropic(
                client, msgs, stream=stream, **{**ANTHROPIC_AGENT_KWARGS, "max_tokens": 300}
            )

        messages = [{"role": "user", "content": "What files are here?"}]
        first = await ask(messages)
        kinds = (["thinking"] if first_p.reasoning else []) + (["text"] if first_p.content else [])
        assert [b.type for b in first.content] == kinds + ["tool_use"] * len(first_p.tool_calls)
        if first_p.reasoning:
            assert first.content[0].thinking == first_p.reasoning
        calls = [b for b in first.content if b.type == "tool_use"]
        assert [(c.name, c.input) for c in calls] == [(t.name, t.arguments) for t in first_p.tool_calls]
        assert first.stop_reason == "tool_use"
        for b in first.content:
            _no_markup(getattr(b, "text", None))
        messages += [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": "a.txt b.txt"} for c in calls
                ],
            },
        ]
        second = await ask(messages)
        texts = [b.text for b in second.content if b.type == "text"]
        thinking = [b.thinking for b in second.content if b.type == "thinking"]
        assert (texts, thinking) == ([second_p.content], [second_p.reasoning] if second_p.reasoning else [])
        assert second.stop_reason == "end_turn"
        _check_turns(srv, h.session_id, dbl, replies, len(first_p.tool_calls))
        await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("name", FAMS)
async def test_openai_sdk_gets_reasoning_content_and_tool_calls(family_toks, name, stream):
    tok = family_toks[name]
    replies, (first_p, second_p) = _script(name, tok)
    async with ScriptedVLLM(tok, script=list(replies)) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
        kwargs = dict(model="gpt-test", tools=OPENAI_TOOLS, reasoning_effort="high")

        async def ask(msgs):
            if not stream:
                r = await client.chat.completions.create(messages=msgs, **kwargs)
                return r.choices[0].message, r.choices[0].finish_reason
            deltas = []
            async with client.chat.completions.stream(messages=msgs, **kwargs) as s:
                async for event in s:
                    if event.type == "chunk" and event.chunk.choices:
                        deltas.append(event.chunk.choices[0].delta)
                final = await s.get_final_completion()
            # reasoning arrives first, as reasoning_content deltas
            kinds = [k for d in deltas for k in ("reasoning_content", "content", "tool_calls") if _has(d, k)]
            assert kinds == sorted(kinds, key=["reasoning_content", "content", "tool_calls"].index)
            return final.choices[0].message, final.choices[0].finish_reason

        messages = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "What files are here?"},
        ]
        msg, finish = await ask(messages)
        assert finish == "tool_calls"
        assert (msg.content or "") == first_p.content
        assert msg.model_extra.get("reasoning_content") == first_p.reasoning
        got = [(c.function.name, json.loads(c.function.arguments)) for c in msg.tool_calls]
        assert got == [(t.name, t.arguments) for t in first_p.tool_calls]
        _no_markup(msg.content)
        messages.append(msg.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "a.txt b.txt"} for c in msg.tool_calls]
        msg2, finish2 = await ask(messages)
        assert (msg2.content, finish2) == (second_p.content, "stop")
        assert msg2.model_extra.get("reasoning_content") == second_p.reasoning
        _check_turns(srv, h.session_id, dbl, replies, len(first_p.tool_calls))
        await client.close()


def _has(delta, key: str) -> bool:
    value = getattr(delta, key, None) if key != "reasoning_content" else (delta.model_extra or {}).get(key)
    return bool(value)


def _check_turns(srv, session_id, dbl, replies, n_calls):
    traj = srv.session(session_id).trajectory
    c = traj.counters
    assert (c.turns, c.tool_calls, c.parse_failures) == (2, n_calls, 0)
    # the record holds exactly the ids the backend returned, in one extended main segment
    (seg,) = traj.segments
    generated = [t for t, m in zip(seg.response_ids.tolist(), seg.response_mask.tolist(), strict=True) if m]
    assert generated == replies[0].token_ids + replies[1].token_ids
    assert [r["prompt"] for r in dbl.main_requests][0] == seg.prompt_ids.tolist()


QUOTED = (
    "<tool_call> </tool_call> <think> </think> <|im_end|> <|end|> <|return|> <|call|> <|channel|> "
    "<|python_tag|> <|eot_id|> <|observation|> <arg_key> <｜tool▁calls▁begin｜> <｜end▁of▁sentence｜>"
)


def _literal(tok, text: str) -> list[int]:
    """``text`` as ordinary tokens, one character at a time (no added token can match)."""
    return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]


@pytest.mark.parametrize("name", FAMS)
async def test_markup_the_model_spells_in_its_answer_reaches_both_clients_as_text(family_toks, name):
    """A model quoting its own markup with ordinary tokens (writing docs about it, say) is text:
    no thinking block, no tool call, no parse failure, every character delivered."""
    tok = family_toks[name]
    reasoning = "RQ" if family(name).traits.reasoning else None
    text, stop = family(name).native(ParsedOutput(content="CQ", reasoning=reasoning))
    ids: list[int] = []
    for k, part in enumerate(text.replace("RQ", "\0").replace("CQ", "\0").split("\0")):
        ids += ([] if k == 0 else _literal(tok, "quoted: " + QUOTED)) + tok.encode(
            part, add_special_tokens=False
        )
    ids.append(tok.convert_tokens_to_ids(stop))
    expected = "quoted: " + QUOTED
    async with ScriptedVLLM(tok, script=[Reply(token_ids=ids, eos=False)] * 2) as dbl:
        async with proxy_server(tok, dbl.url) as srv:
            h = srv.open_session()
            a = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="dummy", max_retries=0)
            async with a.messages.stream(
                model="m",
                max_tokens=2000,
                messages=[{"role": "user", "content": "Explain your markup."}],
                tools=ANTHROPIC_TOOLS,
                thinking={"type": "enabled", "budget_tokens": 100},
            ) as s:
                message = await s.get_final_message()
            thinking = [b.thinking for b in message.content if b.type == "thinking"]
            assert [b.text for b in message.content if b.type == "text"] == [expected]
            assert thinking == ([expected] if reasoning else []) and message.stop_reason == "end_turn"
            o = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
            async with o.chat.completions.stream(
                model="m",
                messages=[{"role": "user", "content": "Explain your markup."}],
                tools=OPENAI_TOOLS,
                reasoning_effort="high",
                max_tokens=2000,
            ) as s2:
                final = await s2.get_final_completion()
            msg = final.choices[0].message
            assert (msg.content, msg.tool_calls, final.choices[0].finish_reason) == (expected, None, "stop")
            assert msg.model_extra.get("reasoning_content") == (expected if reasoning else None)
            c = srv.session(h.session_id).trajectory.counters
            assert (c.parse_failures, c.tool_calls) == (0, 0)
            await a.close()
            await o.close()


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "non-thinking"])
async def test_deepseek_prompt_decides_whether_a_cut_off_output_is_reasoning(family_toks, thinking):
    """DeepSeek-V3.1's template ends the prompt with ``<think>`` in thinking mode (the model
    never writes the opener) and with ``</think>`` otherwise: the same cut-off text is
    reasoning in the first case and the answer in the second."""
    tok = family_toks["deepseek_v31"]
    ids = tok.encode("half a thought about the", add_special_tokens=False)
    async with ScriptedVLLM(tok, script=[Reply(token_ids=ids, finish_reason="length")]) as dbl:
        async with proxy_server(tok, dbl.url) as srv:
            h = srv.open_session()
            client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="dummy", max_retries=0)
            r = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                reasoning_effort="high" if thinking else "none",
            )
            prompt = tok.decode(dbl.requests[0]["prompt"][-3:], skip_special_tokens=False)
            assert prompt.endswith("<think>" if thinking else "</think>")
            msg = r.choices[0].message
            got = (msg.model_extra.get("reasoning_content"), msg.content, r.choices[0].finish_reason)
            text = "half a thought about the"
            assert got == ((text, "", "length") if thinking else (None, text, "length"))
            await client.close()
