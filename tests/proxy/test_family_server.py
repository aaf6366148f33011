"""Every model family through the real proxy server, the official SDKs and the scripted vLLM
double emitting that family's native output (`FamilyFixture.native`, trialflow.families).

Checked per family and protocol: the record equals what the backend received and returned
(each prompt is a prefix of the recorded sequence; the mask-1 tokens are exactly the
generated ones), the decoded sequence holds every message once, and the conversation stays
one segment. Families whose tool-call parser is not registered yet run with tool parsing off
(the client then echoes the raw text and sends results as user messages): the token record
does not depend on parsing. A template that raises answers 400 in the protocol's shape.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from proxy.chat import ParsedOutput, ToolCall
from proxy.parsers import REASONING_PARSERS, TOOL_PARSERS
from proxy.profiles import UnsupportedTemplate, detect_profile, load_generation_eos
from proxy.server import ProxyServer
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import ANTHROPIC_TOOLS, OPENAI_TOOLS, proxy_server
from trialflow.families import FAMILIES, build_tokenizer_dir, family

FAMS = sorted(FAMILIES)
QUOTED = "<|im_end|> <|endoftext|> <|return|> <|call|> <|eot_id|> <|eom_id|> <|user|> <|observation|>"
# Every family's parsers are registered (issue 10b); the tool loop then runs with real tool calls.
TOOL_PARSERS_READY = all(
    n in TOOL_PARSERS for n in ("hermes", "glm45", "deepseek_v31", "harmony", "llama3_json")
)
REASONING_READY = all(n in REASONING_PARSERS for n in ("think", "harmony"))


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, harmony_vocab):  # the harmony parser needs its vocabulary
    root = tmp_path_factory.mktemp("families")
    return {name: build_tokenizer_dir(name, root / name) for name in FAMS}


def _server(tok, dbl_url):
    """A proxy over ``dbl_url``; parsers the family needs but nobody registered yet: off."""
    prof = detect_profile(tok, generation_eos=load_generation_eos(tok.name_or_path))
    parsers = {
        "tool_parser": prof.tool_parser if prof.tool_parser in TOOL_PARSERS else None,
        "reasoning_parser": prof.reasoning_parser if prof.reasoning_parser in REASONING_PARSERS else None,
    }
    return proxy_server(tok, dbl_url, max_context_tokens=8192, **parsers)


def _reply(name: str, content: str = "", reasoning: str = "", call: dict | None = None) -> tuple[Reply, list]:
    calls = [ToolCall(id="x", name="Bash", arguments=call)] if call else []
    text, stop = family(name).native(ParsedOutput(content=content, reasoning=reasoning if family(name).traits.thinks_by_default else None,
                                           tool_calls=calls))  # fmt: skip
    return Reply(text + stop, eos=False), [text, stop]


def _check_record(srv, sid, dbl, tok, generated_texts: list[list[str]], messages_texts: list[str]):
    traj = srv.session(sid).trajectory
    (seg,) = traj.segments
    full = seg.full_ids
    for body in dbl.requests:  # every prompt sent is the recorded sequence up to that turn
        assert full[: len(body["prompt"])] == body["prompt"]
    generated = [t for t, m in zip(seg.response_ids, seg.response_mask, strict=True) if m]
    expected = []
    for text, stop in generated_texts:
        expected += tok.encode(text + stop, add_special_tokens=False)
    assert generated == expected
    decoded = tok.decode(full, skip_special_tokens=False)
    for t in messages_texts:
        assert decoded.count(t) == 1, (t, decoded)
    c = traj.counters
    assert (c.rewrites_client, c.rewrites_template) == (0, 0)


@pytest.mark.parametrize("echo", [True, False], ids=["echoed", "dropped"])
@pytest.mark.parametrize("name", FAMS)
async def test_openai_sdk_tool_loop_per_family(family_dirs, name, echo):
    replies = [
        _reply(name, reasoning="check the folder first", call={"command": "ls srcdir"}),
        _reply(name, content="two files found", reasoning="both listed"),
        _reply(name, content="bye now"),
    ]
    tok = AutoTokenizer.from_pretrained(family_dirs[name])
    async with ScriptedVLLM(tok, script=[r for r, _ in replies]) as dbl, _server(tok, dbl.url) as srv:
        h = srv.open_session()
        client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="k", max_retries=0)
        msgs = [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": f"list files and quote {QUOTED} verbatim"},
        ]
        r1 = (await client.chat.completions.create(model="m", messages=msgs, tools=OPENAI_TOOLS)).choices[0]
        echoed = r1.message.model_dump(exclude_none=True)
        if not echo:
            echoed.pop("reasoning_content", None)
        msgs.append(echoed)
        result = f"alpha.txt beta.txt {QUOTED}"
        assert r1.message.tool_calls or not TOOL_PARSERS_READY, (name, r1.message)
        if r1.message.tool_calls:
            assert r1.message.tool_calls[0].function.name == "Bash"
            assert json.loads(r1.message.tool_calls[0].function.arguments) == {"command": "ls srcdir"}
            msgs.append({"role": "tool", "tool_call_id": r1.message.tool_calls[0].id, "content": result})
        else:  # no parser for this family yet: the result comes back as a user message
            msgs.append({"role": "user", "content": result})
        r2 = (await client.chat.completions.create(model="m", messages=msgs, tools=OPENAI_TOOLS)).choices[0]
        msgs += [r2.message.model_dump(exclude_none=True), {"role": "user", "content": "thanks, stop"}]
        await client.chat.completions.create(model="m", messages=msgs, tools=OPENAI_TOOLS)
        texts = ["You are a coding agent.", msgs[1]["content"], result, "thanks, stop"]
        _check_record(srv, h.session_id, dbl, tok, [g for _, g in replies], texts)
        await client.close()


@pytest.mark.parametrize("name", FAMS)
async def test_anthropic_sdk_system_reminders_next_to_tool_results_per_family(family_dirs, name):
    replies = [
        _reply(name, reasoning="look at it", call={"command": "cat main.py"}),
        _reply(name, content="it prints hello", reasoning="read it"),
    ]
    tok = AutoTokenizer.from_pretrained(family_dirs[name])
    async with ScriptedVLLM(tok, script=[r for r, _ in replies]) as dbl, _server(tok, dbl.url) as srv:
        h = srv.open_session()
        client = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="k", max_retries=0)
        kw = dict(model="m", max_tokens=300, system="You are a coding agent.", tools=ANTHROPIC_TOOLS)
        msgs = [{"role": "user", "content": "what does main.py print?"}]
        first = await client.messages.create(messages=msgs, **kw)
        msgs.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}
        )
        reminder = {"type": "text", "text": "<system-reminder>the todo list is empty</system-reminder>"}
        uses = [b for b in first.content if b.type == "tool_use"]
        assert uses or not TOOL_PARSERS_READY, (name, first.content)
        if family(name).traits.thinks_by_default and REASONING_READY:
            assert [b.thinking for b in first.content if b.type == "thinking"] == ["look at it"]
        if uses:
            result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": "print('hello')"}
        else:
            result = {"type": "text", "text": "print('hello')"}
        msgs.append({"role": "user", "content": [result, reminder]})
        second = await client.messages.create(messages=msgs, **kw)
        assert second.stop_reason == "end_turn"
        texts = ["what does main.py print?", "print('hello')", reminder["text"]]
        _check_record(srv, h.session_id, dbl, tok, [g for _, g in replies], texts)
        await client.close()


@pytest.mark.parametrize("name", [n for n in FAMS if not family(n).traits.parallel_calls])
async def test_a_template_that_raises_is_a_400_in_each_protocol(family_dirs, name):
    """Both templates refuse two tool calls in one assistant message."""
    tok = AutoTokenizer.from_pretrained(family_dirs[name])
    async with ScriptedVLLM(tok) as dbl, _server(tok, dbl.url) as srv:
        h = srv.open_session()
        calls = [
            {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": "{}"}}
            for i in (1, 2)
        ]
        msgs = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
            {"role": "tool", "tool_call_id": "c2", "content": "b"},
        ]
        oa = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="chat template cannot render"):
            await oa.chat.completions.create(model="m", messages=msgs, tools=OPENAI_TOOLS)
        an = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="k", max_retries=0)
        uses = [{"type": "tool_use", "id": f"c{i}", "name": "Bash", "input": {}} for i in (1, 2)]
        results = [{"type": "tool_result", "tool_use_id": f"c{i}", "content": "a"} for i in (1, 2)]
        amsgs = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": uses},
            {"role": "user", "content": results},
        ]
        with pytest.raises(anthropic.BadRequestError, match="chat template cannot render"):
            await an.messages.create(model="m", max_tokens=10, messages=amsgs, tools=ANTHROPIC_TOOLS)
        assert not dbl.requests and srv.session(h.session_id).trajectory.counters.turns == 0
        await oa.close()
        await an.close()


def test_start_up_refuses_an_unservable_template_and_an_unregistered_parser(family_dirs):
    tok = AutoTokenizer.from_pretrained(family_dirs["qwen3"])
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
    with pytest.raises(UnsupportedTemplate, match="no special token"):
        ProxyServer(tokenizer=tok, replicas=[])
    tok = AutoTokenizer.from_pretrained(family_dirs["qwen3"])
    with pytest.raises(UnsupportedTemplate, match="not registered"):
        ProxyServer(tokenizer=tok, replicas=[], profile={"tool_parser": "no_such_parser"})


@pytest.mark.parametrize("name", FAMS)
async def test_openai_sdk_parallel_calls_sub_agent_and_compaction_per_family(family_dirs, name):
    """Segments: one main through parallel calls (where the template allows them), one side for
    the sub-agent, one counted client rewrite for the compacted history."""
    parallel = family(name).traits.parallel_calls
    first = (
        _reply(name, reasoning="two at once", call={"command": "ls one"}) if not parallel else (None, None)
    )
    if parallel:
        calls = [ToolCall(id="x", name="Bash", arguments={"command": c}) for c in ("ls one", "ls two")]
        text, stop = family(name).native(ParsedOutput(content="", tool_calls=calls))
        first = (Reply(text + stop, eos=False), [text, stop])
    sub = _reply(name, content="found it")
    after = _reply(name, content="both listed")
    compacted = _reply(name, content="continuing")
    script = [first, sub, after, compacted]
    tok = AutoTokenizer.from_pretrained(family_dirs[name])
    async with ScriptedVLLM(tok, script=[r for r, _ in script]) as dbl, _server(tok, dbl.url) as srv:
        h = srv.open_session()
        client = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="k", max_retries=0)
        ask = client.chat.completions.create
        msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "list"}]
        r1 = (await ask(model="m", messages=msgs, tools=OPENAI_TOOLS)).choices[0].message
        assert len(r1.tool_calls or ()) == (2 if parallel else 1)
        msgs.append(r1.model_dump(exclude_none=True))
        msgs += [
            {"role": "tool", "tool_call_id": c.id, "content": f"out {i}"} for i, c in enumerate(r1.tool_calls)
        ]
        side = [
            {"role": "system", "content": "You are a search helper."},
            {"role": "user", "content": "find"},
        ]
        await ask(model="m", messages=side)
        r3 = (await ask(model="m", messages=msgs, tools=OPENAI_TOOLS)).choices[0].message
        assert r3.content
        short = [msgs[0], {"role": "user", "content": "summary: listed both, go on"}]
        await ask(model="m", messages=short, tools=OPENAI_TOOLS)
        traj = srv.session(h.session_id).trajectory
        assert [(s.kind, s.rewritten) for s in traj.segments] == [
            ("main", False),
            ("side", False),
            ("main", True),
        ]
        assert (traj.counters.rewrites_client, traj.counters.rewrites_template) == (1, 0)
        main = traj.segments[0]
        generated = [t for t, m in zip(main.response_ids, main.response_mask, strict=True) if m]
        assert generated == tok.encode("".join(first[1] + after[1]), add_special_tokens=False)
        decoded = tok.decode(main.full_ids, skip_special_tokens=False)
        assert decoded.count("out 0") == 1 and decoded.count("out 1") == (1 if parallel else 0)
        await client.close()


async def test_a_session_overrides_the_detected_profile(family_dirs):
    from proxy.session import SessionConfig

    tok = AutoTokenizer.from_pretrained(family_dirs["qwen3"])
    async with ScriptedVLLM(tok) as dbl, _server(tok, dbl.url) as srv:
        h = srv.open_session(SessionConfig(profile={"tool_parser": None, "stop_tokens": ["<|im_end|>"]}))
        s = srv.session(h.session_id)
        assert s.tool_parser is None and s.profile.stop_tokens == ("<|im_end|>",)
        assert srv.profile.stop_tokens == ("<|im_end|>", "<|endoftext|>")  # the proxy's is unchanged
    with pytest.raises(ValueError, match="unknown profile fields"):
        SessionConfig().with_overrides({"profile": {"stops": []}})


# gpt-oss's own output for "reason, say what you will do (a commentary preamble), then call":
# three harmony messages in one turn, ended by the call.
_PREAMBLE_TURN = (
    "<|channel|>analysis<|message|>the tests live in tests/<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>I will run the tests now.<|end|>"
    '<|start|>assistant<|channel|>commentary to=functions.Bash <|constrain|>json<|message|>{"command":"pytest"}',
    "<|call|>",
)


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
async def test_gpt_oss_preamble_before_a_call_extends_token_exactly(family_dirs, protocol):
    """The client echoes the preamble (content), the reasoning and the call; gpt-oss's template
    refuses content and thinking together on a tool-call message (its real rule), so the proxy
    renders them in the form it accepts: the next turn is served, one segment, no rewrite, and
    the recorded sequence holds the model's own three messages."""
    final = _reply("gpt_oss", content="all green", reasoning="passed")
    tok = AutoTokenizer.from_pretrained(family_dirs["gpt_oss"])
    script = [Reply("".join(_PREAMBLE_TURN), eos=False), final[0]]
    async with ScriptedVLLM(tok, script=script) as dbl, _server(tok, dbl.url) as srv:
        h = srv.open_session()
        result = "3 passed"
        if protocol == "openai":
            oa = openai.AsyncOpenAI(base_url=h.openai_base_url, api_key="k", max_retries=0)
            msgs = [
                {"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "test it"},
            ]
            r1 = (await oa.chat.completions.create(model="m", messages=msgs, tools=OPENAI_TOOLS)).choices[0]
            assert r1.message.content == "I will run the tests now."
            assert r1.message.model_dump()["reasoning_content"] == "the tests live in tests/"
            (call,) = r1.message.tool_calls
            msgs += [
                r1.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": result},
            ]
            r2 = await oa.chat.completions.create(model="m", messages=msgs, tools=OPENAI_TOOLS)
            assert r2.choices[0].message.content == "all green"
            await oa.close()
        else:
            an = anthropic.AsyncAnthropic(base_url=h.anthropic_base_url, api_key="k", max_retries=0)
            kw = dict(model="m", max_tokens=300, system="You are a coding agent.", tools=ANTHROPIC_TOOLS)
            amsgs: list = [{"role": "user", "content": "test it"}]
            first = await an.messages.create(messages=amsgs, **kw)
            assert [b.type for b in first.content] == ["thinking", "text", "tool_use"]
            amsgs.append(
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}
            )
            amsgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": first.content[2].id, "content": result}
            ]})  # fmt: skip
            second = await an.messages.create(messages=amsgs, **kw)
            assert [b.text for b in second.content if b.type == "text"] == ["all green"]
            await an.close()
        _check_record(srv, h.session_id, dbl, tok, [list(_PREAMBLE_TURN), final[1]], ["test it", result])
        decoded = tok.decode(
            srv.session(h.session_id).trajectory.segments[0].full_ids, skip_special_tokens=False
        )
        assert decoded.count("I will run the tests now.") == 1  # the model's preamble, as it wrote it
