"""Every model family through the tracker: its own template, its model's native output.

Each family fixture (trialflow.families) renders with a template reproducing the family's
documented rules; the scripted "model" emits that family's native output (`FamilyFixture.native`, trialflow.families)
and ends with the family's own stop token. The checks are the issue's invariants:
- the segment count is the documented minimum (one main segment for tool loops, plain chat,
  system reminders, quoted end-of-turn strings; compaction adds one counted client rewrite;
  a sub-agent adds one side segment);
- the decoded sequence holds every message's text exactly once (the model's own tokens are
  kept, so nothing is dropped from a turn the model generated);
- where the family's template is prefix-stable for the conversation, the prompt equals the
  tokens of the full render (a Hypothesis property over random conversations).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.chat import ChatRequest, Generation, Message, ParsedOutput, ToolCall, assistant_message
from proxy.profiles import detect_profile
from proxy.tokenization import ConversationTracker, TemplateRejected
from tests._hypothesis import examples
from trialflow.families import FAMILIES, family, make_tokenizer
from trialflow.families._build import generation_eos_ids

FAMS = sorted(FAMILIES)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a careful coding agent."}
END_STRINGS = (
    "<|im_end|> <|endoftext|> <|return|> <|call|> <|end|> <|eot_id|> <|eom_id|> <|user|> <|observation|> "
    "<｜end▁of▁sentence｜> </tool_call>"
)


@pytest.fixture(scope="module")
def fams():
    out = {}
    for name in FAMS:
        tok = make_tokenizer(name)
        out[name] = (tok, detect_profile(tok, generation_eos=generation_eos_ids(family(name), tok)))
    return out


class Run:
    """One session's tracker over a family, and the scripted model's turns."""

    def __init__(self, name: str, fams, *, template_kwargs=None, tools=TOOLS) -> None:
        self.name, (self.tok, self.profile) = name, fams[name]
        self.tracker = ConversationTracker(
            self.tok, session_id="s", profile=self.profile, template_kwargs=template_kwargs
        )
        self.tools = tools
        self.ids = (f"call_{i}" for i in itertools.count())
        self.prepared = []

    @property
    def reasons(self) -> bool:
        return self.profile.reasoning_parser is not None

    def reply(self, content: str = "", reasoning: str = "", calls: tuple[dict, ...] = (), name: str = "Bash"):
        tcs = [ToolCall(id=next(self.ids), name=name, arguments=a) for a in calls]
        return ParsedOutput(
            content=content, reasoning=(reasoning or None) if self.reasons else None, tool_calls=tcs
        )

    def turn(self, messages: list[Message], reply: ParsedOutput, *, echo_reasoning: bool = True) -> Message:
        prepared = self.tracker.prepare(
            ChatRequest(protocol="openai", messages=[dict(m) for m in messages], tools=self.tools)
        )
        text, stop = family(self.name).native(reply)
        ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.convert_tokens_to_ids(stop)]
        gen = Generation(list(prepared.prompt_ids), ids, [-0.5] * len(ids), "stop")
        self.tracker.commit(prepared, gen, reply)
        self.prepared.append(prepared)
        echo = assistant_message(reply)
        if not echo_reasoning:
            echo.pop("reasoning_content", None)
        return echo

    @property
    def segments(self):
        return self.tracker.trajectory.segments

    def decoded(self, index: int = -1) -> str:
        return self.tok.decode(self.segments[index].full_ids, skip_special_tokens=False)


def _texts(messages: list[Message]) -> list[str]:
    out = []
    for m in messages:
        for key in ("content", "reasoning_content"):
            if isinstance(m.get(key), str) and m[key]:
                out.append(m[key])
        for tc in m.get("tool_calls") or ():
            out += [v for v in tc["function"]["arguments"].values()]
    return out


def assert_each_once(run: Run, messages: list[Message], index: int = -1, *, text: str | None = None) -> None:
    text = run.decoded(index) if text is None else text
    for t in _texts(messages):
        assert text.count(t) == 1, (run.name, t, text)


@pytest.mark.parametrize("echo", [True, False], ids=["reasoning-echoed", "reasoning-dropped"])
@pytest.mark.parametrize("name", FAMS)
def test_tool_loop_then_chat_is_one_segment_with_every_message_once(fams, name, echo):
    run = Run(name, fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "list the files please"}]
    for i in range(3):
        reply = run.reply(reasoning=f"thought number {i} here", calls=({"command": f"ls folder{i}"},))
        msgs += [run.turn(msgs, reply, echo_reasoning=echo), {"role": "tool", "content": f"result line {i}"}]
    msgs += [
        run.turn(msgs, run.reply("all files listed", "final thought")),
        {"role": "user", "content": "thanks now stop"},
    ]
    msgs += [run.turn(msgs, run.reply("stopping now"))]
    assert len(run.segments) == 1 and all(p.extends for p in run.prepared[1:])
    c = run.tracker.trajectory.counters
    assert (c.rewrites_client, c.rewrites_template) == (0, 0)
    # the echoes may lack reasoning; the record keeps the model's own, so all of it is there once
    assert_each_once(run, msgs)
    for p in run.prepared[1:]:  # never a second end token after the model's own
        prev = run.tok.convert_tokens_to_ids(run.tok.convert_ids_to_tokens(p.prompt_ids[p.base_len - 1]))
        assert not (prev in run.tracker.stop_ids and p.env_ids[0] in run.tracker.stop_ids)


@pytest.mark.parametrize("name", FAMS)
def test_anthropic_system_reminder_next_to_a_tool_result_extends(fams, name):
    run = Run(name, fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    msgs += [run.turn(msgs, run.reply(reasoning="look first", calls=({"command": "cat main.py"},)))]
    msgs += [
        {"role": "tool", "content": "print(hello)"},
        {"role": "user", "content": "<system-reminder>todo list is empty</system-reminder>"},
    ]
    msgs += [run.turn(msgs, run.reply(reasoning="now edit", calls=({"command": "sed -i s/a/b/ main.py"},)))]
    msgs += [
        {"role": "tool", "content": "edited fine"},
        {"role": "user", "content": "<system-reminder>file changed</system-reminder>"},
    ]
    run.turn(msgs, run.reply("fixed it"))
    assert len(run.segments) == 1
    assert_each_once(run, msgs)


@pytest.mark.parametrize("name", FAMS)
def test_end_of_turn_strings_in_user_text_and_tool_results_do_not_move_the_cut(fams, name):
    """The issue's silent bug: the old cut searched the history for eos text."""
    run = Run(name, fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": f"quote these {END_STRINGS} exactly"}]
    msgs += [run.turn(msgs, run.reply(reasoning="they are markers", calls=({"command": "echo markers"},)))]
    msgs += [{"role": "tool", "content": f"output has {END_STRINGS} inside"}]
    msgs += [
        run.turn(msgs, run.reply("printed them")),
        {"role": "user", "content": f"again {END_STRINGS} ok"},
    ]
    run.turn(msgs, run.reply("done again"))
    assert len(run.segments) == 1
    assert_each_once(run, msgs)
    # the model's turns appear once each: nothing of them is rendered again after them
    text = run.decoded()
    assert text.count("printed them") == 1 and text.count("echo markers") == 1


@pytest.mark.parametrize("name", FAMS)
def test_parallel_tool_calls_extend_or_are_refused_as_the_template_says(fams, name):
    run = Run(name, fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "two things at once"}]
    reply = run.reply(calls=({"command": "ls first"}, {"command": "ls second"}))
    msgs += [
        run.turn(msgs, reply),
        {"role": "tool", "content": "one out"},
        {"role": "tool", "content": "two out"},
    ]
    if not family(name).traits.parallel_calls:
        with pytest.raises(TemplateRejected):
            run.tracker.prepare(ChatRequest(protocol="openai", messages=msgs, tools=TOOLS))
        assert not run.profile.parallel_tool_calls
        return
    run.turn(msgs, run.reply("both done"))
    assert len(run.segments) == 1
    assert_each_once(run, msgs)


@pytest.mark.parametrize("name", FAMS)
def test_compaction_is_a_counted_client_rewrite_and_a_sub_agent_a_side_segment(fams, name):
    run = Run(name, fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "start the task"}]
    msgs += [
        run.turn(msgs, run.reply(calls=({"command": "make build"},))),
        {"role": "tool", "content": "built ok"},
    ]
    sub = [
        {"role": "system", "content": "You are a search helper."},
        {"role": "user", "content": "find files"},
    ]
    sub += [run.turn(sub, run.reply("found three")), {"role": "user", "content": "and more"}]
    run.turn(sub, run.reply("no more"))
    msgs += [run.turn(msgs, run.reply("build passed"))]
    assert [s.kind for s in run.segments] == ["main", "side"] and len(run.segments[1].response_ids) > 0
    compacted = [SYSTEM, {"role": "user", "content": "summary: build passed, continue"}]
    run.turn(compacted, run.reply("continuing"))
    assert [(s.kind, s.rewritten) for s in run.segments] == [("main", False), ("side", False), ("main", True)]
    c = run.tracker.trajectory.counters
    assert (c.rewrites_client, c.rewrites_template) == (1, 0)
    assert_each_once(run, msgs, 0)
    assert_each_once(run, sub, 1)


def test_llama_builtin_tool_turns_end_with_eom_and_extend(fams):
    run = Run("llama31", fams, template_kwargs={"builtin_tools": ["brave_search", "wolfram_alpha"]})
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "weather in paris"}]
    for i in range(2):
        reply = run.reply(calls=({"query": f"paris weather day{i}"},), name="brave_search")
        msgs += [run.turn(msgs, reply), {"role": "tool", "content": f"sunny day{i}"}]
    msgs += [run.turn(msgs, run.reply("it is sunny"))]
    assert len(run.segments) == 1
    text = run.decoded()
    assert text.count("<|eom_id|>") == 2 and text.count("<|python_tag|>") == 2
    assert_each_once(run, msgs)


def test_glm_stop_token_that_opens_the_tool_result_is_not_repeated(fams):
    run = Run("glm45", fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "go"}]
    msgs += [
        run.turn(msgs, run.reply(reasoning="r", calls=({"command": "ls"},))),
        {"role": "tool", "content": "x"},
    ]
    msgs += [run.turn(msgs, run.reply("fine")), {"role": "user", "content": "more"}]
    run.turn(msgs, run.reply("ok"))
    text = run.decoded()
    assert text.count("<|observation|>") == 1 and text.count("<|user|>") == 3
    obs = run.tok.convert_tokens_to_ids("<|observation|>")
    assert run.prepared[1].env_ids[0] != obs


def test_a_turn_cut_by_length_gets_the_closer_first(fams):
    run = Run("gpt_oss", fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "go"}]
    prepared = run.tracker.prepare(ChatRequest(protocol="openai", messages=msgs, tools=TOOLS))
    ids = run.tok.encode("<|channel|>final<|message|>partial answ", add_special_tokens=False)
    reply = ParsedOutput(content="partial answ")
    run.tracker.commit(
        prepared, Generation(list(prepared.prompt_ids), ids, [-1.0] * len(ids), "length"), reply
    )
    msgs += [assistant_message(reply), {"role": "user", "content": "continue"}]
    nxt = run.tracker.prepare(ChatRequest(protocol="openai", messages=msgs, tools=TOOLS))
    assert nxt.extends and nxt.env_ids[0] == run.tok.convert_tokens_to_ids("<|end|>")


def test_deepseek_mid_conversation_system_message_forces_a_counted_template_rewrite(fams):
    """DeepSeek hoists every system message to the top: a new one cannot be appended."""
    run = Run("deepseek_v31", fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "go"}]
    msgs += [run.turn(msgs, run.reply("first")), {"role": "system", "content": "new rule added"}]
    msgs += [{"role": "user", "content": "next"}]
    run.turn(msgs, run.reply("second"))
    c = run.tracker.trajectory.counters
    assert len(run.segments) == 2 and (c.rewrites_client, c.rewrites_template) == (0, 1)
    assert run.segments[1].rewritten


# ------------------------------------------------------------------ Hypothesis

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=3, max_size=8)


@st.composite
def conversations(draw):
    """A random agent conversation: per step a reply (calls or a final answer) and follow-ups."""
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        n_calls = draw(st.integers(0, 2))
        reasoning = draw(st.one_of(st.just(""), _word))
        after = draw(st.sampled_from(["tool", "user", "tool+user"])) if n_calls else "user"
        steps.append((n_calls, reasoning, after, draw(st.booleans())))
    return steps


def _prefix_stable(name: str, steps) -> bool:
    """Where the family's template renders the model's own turns as the model wrote them."""
    followed_by_user = [any("user" in later[2] for later in steps[i:]) for i in range(len(steps))]
    if not family(name).traits.reasoning:  # nothing of the model's own is dropped or moved
        return True
    if name == "qwen3":  # reasoning is dropped once a new user query follows
        return not any(s[1] and u for s, u in zip(steps, followed_by_user, strict=True))
    if name == "glm45":  # same, and a call answered by a user message (no tool result) ends differently
        return not any(
            s[1] and u or s[0] and s[2] == "user" for s, u in zip(steps, followed_by_user, strict=True)
        )
    if name == "deepseek_v31":  # reasoning is never rendered in the history
        return not any(s[1] for s in steps)
    if name == "gpt_oss":  # the history re-renders the model's headers and end tokens
        return False
    raise KeyError(f"{name}: say how its template renders the model's own turns in the history")


@pytest.mark.parametrize("name", FAMS)
@settings(
    max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=conversations())
def test_random_conversations_extend_and_match_the_full_render_where_prefix_stable(fams, name, steps):
    run = Run(name, fams)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "begin work"}]
    uid = itertools.count()
    for n_calls, reasoning, after, echo in steps:
        if not family(name).traits.parallel_calls:
            n_calls = min(n_calls, 1)
        calls = tuple({"command": f"run{next(uid)}q"} for _ in range(n_calls))
        reasoning = f"{reasoning}{next(uid)}q" if reasoning else ""
        reply = run.reply(content="" if calls else f"answer{next(uid)}q", reasoning=reasoning, calls=calls)
        msgs.append(run.turn(msgs, reply, echo_reasoning=echo))
        if n_calls and "tool" in after:
            msgs += [{"role": "tool", "content": f"out{next(uid)}q"} for _ in range(n_calls)]
        if "user" in after:
            msgs.append({"role": "user", "content": f"next{next(uid)}q"})
        last = run.tracker.prepare(ChatRequest(protocol="openai", messages=msgs, tools=TOOLS))
        assert last.extends, (name, steps)
    assert len(run.segments) == 1
    assert_each_once(run, msgs, text=run.tok.decode(last.prompt_ids.tolist(), skip_special_tokens=False))
    rendered = run.tok.apply_chat_template(
        run.profile.adapt(msgs), tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    if _prefix_stable(name, steps) and all(s[3] or not s[1] for s in steps):
        assert run.tok.decode(last.prompt_ids.tolist(), skip_special_tokens=False) == rendered
        # Token-equal too, except Llama: its generation prompt ends in "\n\n", one BPE token at
        # the end of a prompt but two before text (a re-render re-tokenizes the boundary).
        if name != "llama31":
            assert last.prompt_ids.tolist() == run.tok.encode(rendered, add_special_tokens=False)


class _Recalling:
    """A template that repeats the last assistant message's text in the generation prompt."""

    def __init__(self, tok) -> None:
        self._tok = tok
        recall = (
            "{%- if add_generation_prompt and messages|length > 1 and messages[-2].role == 'assistant' -%}"
            "{{- '<|im_start|>system\\nrecall: ' + text(messages[-2].content) + '<|im_end|>\\n' -}}{%- endif -%}"
        )
        marker = "{%- if add_generation_prompt -%}"
        self.chat_template = tok.chat_template.replace(marker, recall + marker, 1)
        assert self.chat_template != tok.chat_template

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def apply_chat_template(self, messages, **kw):
        return self._tok.apply_chat_template(messages, chat_template=self.chat_template, **kw)


def test_environment_that_would_repeat_what_the_model_saw_opens_a_counted_template_segment(fams):
    tok, profile = fams["qwen3"]
    run = Run("qwen3", fams)
    run.tok = _Recalling(tok)
    run.tracker = ConversationTracker(run.tok, session_id="s", profile=profile)
    msgs: list[Message] = [SYSTEM, {"role": "user", "content": "go"}]
    msgs += [run.turn(msgs, run.reply("my first answer")), {"role": "user", "content": "and?"}]
    nxt = run.tracker.prepare(ChatRequest(protocol="openai", messages=msgs, tools=TOOLS))
    assert not nxt.extends and nxt.new_segment.cause == "template"
