"""proxy.parsers: registry, decoder, and one shared suite that every output format inherits.

Each format's suite says how that family writes reasoning, content and tool calls (its
native markup, from the family's documentation and vLLM's parsers); the shared tests then
check the same rules for all of them: single and parallel calls, dropped and truncated
reasoning, malformed markup counted and kept, literal markup strings in text staying text,
arbitrary input never raising, and the property that where the output is cut into chunks
(text pieces, or BPE tokens through a real tokenizer and ``OutputDecoder``) never changes
the result.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.parsers import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    Markup,
    OutputDecoder,
    Piece,
    Registry,
    markup_of,
    parse_output,
    strip_text_suffix,
    text_of,
)
from proxy.parsers._pieces import merged, split_markup
from tests._hypothesis import examples

# ------------------------------------------------------------------ registry


def test_unknown_name_lists_available():
    with pytest.raises(
        KeyError, match="available: deepseek_v31, glm45, harmony, hermes, llama3_json, qwen3_coder"
    ):
        TOOL_PARSERS.get("nope")
    with pytest.raises(KeyError, match="available: harmony, think"):
        parse_output("x", reasoning="deepseek")
    with pytest.raises(KeyError, match="unknown tool parser 'glm'"):
        markup_of(None, "glm")


def test_registry_imports_lazily_and_validates_targets():
    reg: Registry[Any] = Registry("thing", {"broken": "no_such_module_xyz:Thing"})
    assert reg.names() == ["broken"] and "broken" in reg  # registering did not import
    with pytest.raises(ModuleNotFoundError):
        reg.get("broken")
    reg.register("json", "json:dumps")
    assert reg.get("json") is json.dumps
    with pytest.raises(ValueError):
        reg.register("bad", "json.dumps")


def test_harmony_without_its_vocabulary_fails_when_made(harmony_vocab, tmp_path, monkeypatch):
    from proxy.parsers import HarmonyUnavailable, check_parsers
    from proxy.parsers._harmony import _encoding

    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", str(tmp_path))
    _encoding.cache_clear()
    try:
        with pytest.raises(HarmonyUnavailable, match="TIKTOKEN_ENCODINGS_BASE"):
            check_parsers(None, "harmony")
    finally:
        monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", harmony_vocab)
        _encoding.cache_clear()
    check_parsers(None, "harmony")


# ------------------------------------------------------------------ pieces and decoder


def test_split_markup_longest_first_and_text_between():
    tags = ["<tool_call>", "<tool_call_x>", "</tool_call>"]
    assert split_markup("a<tool_call_x>b</tool_call>", tags) == [
        "a",
        Markup("<tool_call_x>"),
        "b",
        Markup("</tool_call>"),
    ]
    assert split_markup("", tags) == [] and split_markup("plain", []) == ["plain"]


def test_strip_text_suffix_cuts_across_pieces():
    pieces: list[Piece] = ["ab", Markup("<x>"), "cdEND"]
    assert strip_text_suffix(pieces, "END") == ["ab", Markup("<x>"), "cd"]
    assert strip_text_suffix(pieces, "<x>cdEND") == ["ab"]
    assert strip_text_suffix(pieces, "dEND") == ["ab", Markup("<x>"), "c"]


def test_decoder_keeps_markup_tokens_apart_from_text(markup_tok):
    ids = markup_tok.encode("hi <tool_call>", add_special_tokens=False)
    ids += _literal_ids(markup_tok, "</tool_call>") + [markup_tok.eos_token_id]
    pieces = OutputDecoder(markup_tok, ["<tool_call>", "</tool_call>"]).decode(ids)
    # the real token is markup, the same characters typed as ordinary tokens are text
    assert pieces == ["hi ", Markup("<tool_call>"), "</tool_call>", Markup("<|im_end|>", special=True)]


def test_decoder_splits_markup_the_tokenizer_spells_with_ordinary_tokens(tok):
    # the tiny tokenizer has no <arg_key> token: the decoder finds it in the text
    ids = tok.encode("<tool_call>f\n<arg_key>k</arg_key>", add_special_tokens=False)
    pieces = OutputDecoder(tok, TOOL_PARSERS.get("glm45").markup).decode(ids)
    assert pieces == [Markup("<tool_call>"), "f\n", Markup("<arg_key>"), "k", Markup("</arg_key>")]


def test_decoder_joins_multibyte_characters_split_across_tokens(markup_tok):
    text = "naïve 漢字 🚀 ok"
    ids = markup_tok.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # several characters need more than one token
    assert OutputDecoder(markup_tok).decode(ids) == [text]


def test_unknown_special_token_mid_output_is_a_failure_kept_as_text():
    pieces: list[Piece] = ["a", Markup("<|im_start|>", special=True), "b", Markup("<|im_end|>", special=True)]
    out = parse_output(pieces, reasoning=None, tools="hermes")
    # the trailing EOS ended the turn; the role header in the middle is malformed
    assert (out.content, out.parse_failures) == ("a<|im_start|>b", 1)
    benign = parse_output(["x", Markup("<tool_response>"), "y"], reasoning=None, tools="hermes")
    assert (benign.content, benign.parse_failures) == ("x<tool_response>y", 0)


# ------------------------------------------------------------------ think reasoning

think = REASONING_PARSERS.get("think")()


@pytest.mark.parametrize(
    "text, reasoning, rest",
    [
        ("<think>\nplan\n</think>\n\nanswer", "plan", "\n\nanswer"),
        ("  <think>plan</think>answer", "plan", "answer"),
        ("plan started in prompt\n</think>\n\nanswer", "plan started in prompt", "\n\nanswer"),
        ("<think>\ntruncated before closing", "truncated before closing", ""),
        ("<think>\n\n</think>\n\nanswer", None, "\n\nanswer"),
        ("no reasoning at all", None, "no reasoning at all"),
        ("answer mentions <think> later", None, "answer mentions <think> later"),
        ("<think>a</think>b</think>c", "a", "b</think>c"),
    ],
)
def test_think_split(text, reasoning, rest):
    r, pieces = think.split(split_markup(text, think.markup))
    assert (r, text_of(pieces)) == (reasoning, rest)


def test_think_started_inside_the_prompt():
    assert think.starts_inside(["<|Assistant|>", Markup("<think>"), "\n"])
    assert not think.starts_inside([Markup("<think>"), "\n", Markup("</think>"), "\n\n"])
    assert not think.starts_inside(["assistant\n"])
    r, rest = think.split(["half a thought, cut off"], started_inside=True)
    assert (r, rest) == ("half a thought, cut off", [])


# ------------------------------------------------------------------ the shared suite

_SHARED = {"deadline": None, "suppress_health_check": [HealthCheck.differing_executors]}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "command": {"type": "string"},
                    "n": {"type": "integer"},
                    "flag": {"type": "boolean"},
                    "items": {"type": "array"},
                },
            },
        },
    }
    for name in ("Bash", "Read")
]
_strings = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12)
_args = st.fixed_dictionaries(
    {},
    optional={
        "path": _strings,
        "command": _strings,
        "n": st.integers(-1000, 1000),
        "flag": st.booleans(),
        "items": st.lists(st.integers(0, 9), max_size=3),
    },
)
_calls = st.lists(st.tuples(st.sampled_from(["Bash", "Read"]), _args), max_size=3)
_content = st.text(st.sampled_from(list("abc xyz.\n")), max_size=16)
_reasoning = st.none() | st.text(st.sampled_from(list("abc xyz.\n")), max_size=16).filter(str.strip)
Call = tuple[str, dict[str, Any]]


def _words(s: str | None) -> str:
    return " ".join((s or "").split())


class ParserSuite:
    """Every output format inherits these tests. A subclass renders its family's native
    output (reasoning, content, calls) as pieces, the way the model generates them."""

    tools: ClassVar[str]
    reasoning: ClassVar[str | None] = "think"
    started_inside = False  # the family's prompt opens the reasoning (DeepSeek thinking mode)
    # The family cannot write visible text next to calls in one turn (only one of them comes out).
    content_with_calls = True
    malformed: ClassVar[list[list[Piece]]] = []

    def render_reasoning(self, reasoning: str | None) -> list[Piece]:
        if self.started_inside:
            return [reasoning or "", Markup("</think>"), "\n\n"]
        return [] if reasoning is None else [Markup("<think>"), reasoning, Markup("</think>"), "\n\n"]

    def render(self, reasoning: str | None, content: str, calls: list[Call]) -> list[Piece]:
        raise NotImplementedError

    def parse(self, output: str | list[Piece], **kw):
        ids = iter(range(1000))
        kw.setdefault("tool_specs", TOOLS)
        kw.setdefault("started_inside_reasoning", self.started_inside)
        return parse_output(
            output,
            reasoning=self.reasoning,
            tools=self.tools,
            tool_call_id_factory=lambda: f"id{next(ids)}",
            **kw,
        )

    @property
    def markup(self) -> frozenset[str]:
        return markup_of(self.reasoning, self.tools)

    def check(self, out, reasoning, content, calls):
        assert [(c.name, c.arguments) for c in out.tool_calls] == calls
        assert _words(out.content) == _words(content)
        assert out.reasoning == (reasoning.strip() if reasoning and reasoning.strip() else None)
        assert out.parse_failures == 0

    # --- fixed cases

    def test_single_call_with_content(self):
        content = "Let me look." if self.content_with_calls else ""
        out = self.parse(self.render("I should list.", content, [("Bash", {"command": "ls -la"})]))
        self.check(out, "I should list.", content, [("Bash", {"command": "ls -la"})])
        assert [c.id for c in out.tool_calls] == ["id0"]

    def test_parallel_calls_keep_order(self):
        calls = [("Read", {"path": "a"}), ("Read", {"path": "b"}), ("Bash", {"command": "x", "n": 3})]
        out = self.parse(self.render(None, "", calls))
        self.check(out, None, "", calls)
        assert [c.id for c in out.tool_calls] == ["id0", "id1", "id2"]

    def test_plain_answer_without_reasoning(self):
        """The client turned thinking off (or the model skipped it): all of it is content."""
        out = self.parse(self.render(None, "Just the answer.", []))
        self.check(out, None, "Just the answer.", [])

    def test_truncated_reasoning_is_all_reasoning(self):
        pieces = self.render("thinking hard", "", [])
        cut = max(i for i, p in enumerate(pieces) if isinstance(p, str) and "thinking hard" in p)
        out = self.parse(pieces[: cut + 1])
        assert (out.reasoning, out.content, out.tool_calls) == ("thinking hard", "", [])

    def test_literal_markup_strings_in_text_stay_text(self):
        """Text that spells the family's markup (ordinary tokens, not the markup tokens) is
        content, and inside arguments it is the argument's value."""
        literal = " ".join(sorted(self.markup))
        content = f"The markup is {literal} ok." if self.content_with_calls else ""
        calls = [("Bash", {"command": f"echo '{literal}'"})]
        out = self.parse(self.render(f"about {literal}", content, calls))
        self.check(out, f"about {literal}", content, calls)
        plain = self.parse(self.render(None, f"only text: {literal}", []))
        self.check(plain, None, f"only text: {literal}", [])

    def kept_text(self, bad: list[Piece]) -> list[str]:
        """The model's text in ``bad`` that must stay visible (content or reasoning)."""
        return [p for p in bad if isinstance(p, str)]

    def test_malformed_calls_are_counted_and_kept(self):
        assert self.malformed, "every format lists its malformed cases"
        for bad in self.malformed:
            out = self.parse(bad, started_inside_reasoning=False)
            assert out.parse_failures >= 1, bad
            visible = _words(out.content + " " + (out.reasoning or ""))
            for text in self.kept_text(bad):
                assert _words(text) in visible, (bad, out)  # nothing of the model's text is dropped

    def test_deeply_nested_json_does_not_raise(self):
        deep = "[" * 100_000
        pieces = self.render(None, "", [("Bash", {"command": "PLACEHOLDER"})])
        pieces = [
            p.replace('"PLACEHOLDER"', deep).replace("PLACEHOLDER", deep) if isinstance(p, str) else p
            for p in pieces
        ]
        out = self.parse(pieces)
        # JSON formats fail the call; formats with raw string values keep it as the string
        assert out.parse_failures == 1 or [c.arguments for c in out.tool_calls] == [{"command": deep}]

    # --- properties

    @settings(max_examples=examples(100), **_SHARED)
    @given(
        st.lists(
            st.one_of(_content, st.sampled_from(["<think>", "</think>", '{"name"', ";", "{"])), max_size=8
        ),
        st.data(),
    )
    def test_arbitrary_pieces_never_raise(self, texts, data):
        markup = sorted(self.markup | {"<|im_start|>", "<|im_end|>"})
        pieces = [
            Markup(data.draw(st.sampled_from(markup)), special=data.draw(st.booleans())) if t == "{" else t
            for t in texts
        ]
        out = self.parse(pieces)
        assert out.parse_failures >= 0
        out = self.parse(text_of(pieces))
        assert out.parse_failures >= 0

    @settings(max_examples=examples(60), **_SHARED)
    @given(reasoning=_reasoning, content=_content, calls=_calls, data=st.data())
    def test_chunk_boundaries_never_change_the_result(self, reasoning, content, calls, data):
        if calls and not self.content_with_calls:
            content = ""
        pieces = self.render(reasoning, content, calls)
        whole = self.parse(pieces)
        self.check(whole, reasoning, content, calls)
        chunked: list[Piece] = []
        for p in pieces:
            if isinstance(p, Markup) or len(p) < 2:
                chunked.append(p)
                continue
            cuts = sorted(data.draw(st.sets(st.integers(1, len(p) - 1), max_size=4)))
            chunked.extend(p[a:b] for a, b in zip([0, *cuts], [*cuts, len(p)], strict=True))
        assert self.parse(chunked) == whole
        assert self.parse(text_of(pieces)) == whole  # one string: markup found in the text

    @settings(max_examples=examples(30), **_SHARED)
    @given(reasoning=_reasoning, content=_content, calls=_calls, data=st.data())
    def test_token_boundaries_through_a_real_tokenizer(self, markup_tok, reasoning, content, calls, data):
        """Encoded with the tokenizer (markup as its tokens, text cut into BPE runs at random
        points) and decoded by OutputDecoder, the output parses the same."""
        if calls and not self.content_with_calls:
            content = ""
        pieces = self.render(reasoning, content, calls)
        ids: list[int] = []
        for p in pieces:
            if isinstance(p, Markup):
                ids.append(markup_tok.convert_tokens_to_ids(p.text))
                continue
            cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(p) - 1)), max_size=3))) if p else []
            for chunk in (p[a:b] for a, b in zip([0, *cuts], [*cuts, len(p)], strict=True)):
                ids.extend(_literal_ids(markup_tok, chunk))
        ids.append(markup_tok.eos_token_id)
        decoded = OutputDecoder(markup_tok, self.markup).decode(ids)
        assert _shape(decoded[:-1]) == _shape(pieces)
        assert self.parse(decoded) == self.parse(pieces)


def _shape(pieces) -> list[tuple[str, str]]:
    return [("text", p) if isinstance(p, str) else ("markup", p.text) for p in merged(pieces)]


class ThinkBlockSuite(ParserSuite):
    """Formats whose calls sit in ``<tool_call>`` blocks after the content."""

    def render_call(self, name: str, args: dict[str, Any]) -> list[Piece]:
        raise NotImplementedError

    def render(self, reasoning, content, calls):
        out = self.render_reasoning(reasoning) + ([content] if content else [])
        for name, args in calls:
            out += ["\n"] + self.render_call(name, args)
        return out

    def test_unclosed_call_is_a_failure(self):
        call = self.render_call("Bash", {"command": "ls"})
        out = self.parse(["x "] + call[:-1])
        assert out.tool_calls == [] and out.parse_failures == 1 and "<tool_call>" in out.content

    def test_tool_call_inside_reasoning_is_not_a_call(self):
        pieces = [Markup("<think>"), "maybe ", *self.render_call("Bash", {}), Markup("</think>"), "no call"]
        out = self.parse(pieces)
        assert out.tool_calls == [] and out.content == "no call" and "<tool_call>" in out.reasoning


def _value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


class TestHermes(ThinkBlockSuite):
    tools = "hermes"
    malformed: ClassVar[list[list[Piece]]] = [
        [Markup("<tool_call>"), "\n{not json}\n", Markup("</tool_call>")],
        [Markup("<tool_call>"), '\n{"arguments": {"a": 1}}\n', Markup("</tool_call>")],  # no name
        [Markup("<tool_call>"), '\n{"name": "", "arguments": {}}\n', Markup("</tool_call>")],
        [Markup("<tool_call>"), '\n{"name": "X", "arguments": [1, 2]}\n', Markup("</tool_call>")],
        [Markup("<tool_call>"), '\n["name", "X"]\n', Markup("</tool_call>")],
        ["before ", Markup("<tool_call>"), '\n{"name": "X", "arguments": {}}'],  # truncated
    ]

    def render_call(self, name, args):
        return [
            Markup("<tool_call>"),
            "\n" + json.dumps({"name": name, "arguments": args}) + "\n",
            Markup("</tool_call>"),
        ]

    def test_string_arguments_and_missing_arguments(self):
        out = self.parse(
            '<tool_call>{"name": "A", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{"name": "B"}</tool_call>'
        )
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("A", {"x": 1}), ("B", {})]

    def test_markup_token_inside_a_json_string_is_text(self):
        """A model writing a file that contains ``</tool_call>`` may emit the real token."""
        body = ['\n{"name": "Write", "arguments": {"text": "a ', Markup("<think>"), ' b"}}\n']
        out = self.parse([Markup("<tool_call>"), *body, Markup("</tool_call>")])
        assert [c.arguments for c in out.tool_calls] == [{"text": "a <think> b"}]


class TestQwen3Coder(ThinkBlockSuite):
    tools = "qwen3_coder"
    malformed: ClassVar[list[list[Piece]]] = [
        [Markup("<tool_call>"), "\n<function=>\n</function>\n", Markup("</tool_call>")],  # empty name
        [Markup("<tool_call>"), "\n<parameter=a>\n1\n</parameter>\n", Markup("</tool_call>")],  # no function
        [Markup("<tool_call>"), "\n<function=X>\n<parameter=a>\n1\n</function>\n", Markup("</tool_call>")],
        [Markup("<tool_call>"), "\n<function=X>\nstray text\n</function>\n", Markup("</tool_call>")],
    ]

    def render_call(self, name, args):
        params = "".join(f"<parameter={k}>\n{_value(v)}\n</parameter>\n" for k, v in args.items())
        return [Markup("<tool_call>"), f"\n<function={name}>\n{params}</function>\n", Markup("</tool_call>")]

    def test_values_json_when_they_parse_else_strings(self):
        text = (
            "<tool_call>\n<function=Edit>\n<parameter=n>\n42\n</parameter>\n<parameter=s>\nhello world\n"
            "</parameter>\n<parameter=code>\ndef f():\n    return 1\n\n</parameter>\n"
            "</function>\n</tool_call>"
        )
        (call,) = self.parse(text).tool_calls
        assert call.arguments == {"n": 42, "s": "hello world", "code": "def f():\n    return 1\n"}

    def test_schema_string_parameters_stay_strings(self):
        text = (
            "<tool_call>\n<function=Bash>\n<parameter=command>\n42\n</parameter>\n"
            "<parameter=n>\n42\n</parameter>\n</function>\n</tool_call>"
        )
        (call,) = self.parse(text).tool_calls
        assert call.arguments == {"command": "42", "n": 42}


def _glm(text: str) -> list[Piece]:
    return split_markup(text, TOOL_PARSERS.get("glm45").markup | {"<think>", "</think>"})


class TestGlm45(ThinkBlockSuite):
    tools = "glm45"
    malformed: ClassVar[list[list[Piece]]] = [
        _glm("<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"),  # no name
        _glm("<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>"),  # key without value
        _glm("<tool_call>f\n<arg_key>a</arg_key><arg_value>1</tool_call>"),  # unclosed value
        _glm("<tool_call>f\nstray<arg_key>a</arg_key><arg_value>1</arg_value>junk</tool_call>"),
        _glm("<tool_call>two words\nmore\n</tool_call>"),
    ]

    def render_call(self, name, args):
        out: list[Piece] = [Markup("<tool_call>"), f"{name}\n"]
        for k, v in args.items():
            out += [
                Markup("<arg_key>"),
                k,
                Markup("</arg_key>"),
                "\n",
                Markup("<arg_value>"),
                _value(v),
                Markup("</arg_value>"),
                "\n",
            ]
        return out + [Markup("</tool_call>")]

    def test_values_by_schema_then_json_then_string(self):
        def pair(k, v):
            return [
                Markup("<arg_key>"),
                k,
                Markup("</arg_key>"),
                "\n",
                Markup("<arg_value>"),
                v,
                Markup("</arg_value>"),
            ]

        call = [
            Markup("<tool_call>"),
            "Bash\n",
            *pair("command", "42"),
            "\n",
            *pair("n", " 7 "),
            *pair("other", "not json ["),
        ]
        (c,) = self.parse([*call, Markup("</tool_call>")]).tool_calls
        assert c.arguments == {"command": "42", "n": 7, "other": "not json ["}

    def test_markup_spelled_in_text_by_a_tokenizer_without_those_tokens(self, tok):
        ids = tok.encode(
            "<tool_call>Bash\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>"
        )
        out = self.parse(OutputDecoder(tok, self.markup).decode(ids))
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("Bash", {"command": "ls"})]


class TestDeepSeekV31(ParserSuite):
    tools = "deepseek_v31"
    started_inside = True  # thinking mode: the prompt ends with <think>
    B, E = Markup("<｜tool▁calls▁begin｜>"), Markup("<｜tool▁calls▁end｜>")
    CB, CE, SEP = Markup("<｜tool▁call▁begin｜>"), Markup("<｜tool▁call▁end｜>"), Markup("<｜tool▁sep｜>")
    malformed: ClassVar[list[list[Piece]]] = [
        [B, CB, "Bash", SEP, "{not json", CE, E],
        [B, CB, "", SEP, "{}", CE, E],  # empty name
        [B, CB, "Bash", SEP, "[1]", CE, E],  # arguments not an object
        [B, CB, "Bash", '{"a": 1}', CE, E],  # no separator
        [B, CB, "Bash", SEP, '{"a": 1}', E],  # unclosed call
        ["text ", CB, "Bash", SEP, "{}", CE],  # call outside a calls block
        [B, "stray words", E],
    ]

    def render(self, reasoning, content, calls):
        out = self.render_reasoning(reasoning) + ([content] if content else [])
        if calls:
            out.append(self.B)
            for name, args in calls:
                out += [self.CB, name, self.SEP, json.dumps(args, ensure_ascii=False), self.CE]
            out.append(self.E)
        return out

    def test_complete_calls_of_an_unclosed_block_are_kept(self):
        out = self.parse(
            [self.B, self.CB, "Read", self.SEP, '{"path": "a"}', self.CE], started_inside_reasoning=False
        )
        assert [c.name for c in out.tool_calls] == ["Read"] and out.parse_failures == 1

    def test_non_thinking_mode_is_all_content(self):
        out = self.parse(["plain answer"], started_inside_reasoning=False)
        assert (out.reasoning, out.content) == (None, "plain answer")


class TestLlama3Json(ParserSuite):
    tools = "llama3_json"
    reasoning = None
    TAG = Markup("<|python_tag|>")
    malformed: ClassVar[list[list[Piece]]] = [
        [TAG, '{"name": "Bash", "parameters": {"command": "ls"'],  # truncated
        [TAG, "not a call at all"],
        ['{"name": "Bash", "parameters": {"command": "ls"}} trailing prose'],
        ['{"name": "Bash", "parameters": [1]}'],
        [TAG, '{"name": "A", "parameters": {}}; ; {"name": "B"}'],
        [TAG, 'brave_search.call(query=open("x").read())'],  # not a literal
    ]

    def render_reasoning(self, reasoning):
        return []

    def render(self, reasoning, content, calls):
        if not calls:
            return [content]
        body = "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
        # with visible text the call needs the tag; without, both forms occur
        return [content, self.TAG, body] if content or len(calls) % 2 else [body]

    def check(self, out, reasoning, content, calls):
        super().check(out, None, content, calls)

    def test_truncated_reasoning_is_all_reasoning(self):
        pytest.skip("Llama-3.1 has no reasoning markup")

    def test_json_answer_without_tools_markup_is_content(self):
        out = self.parse(['{"result": 42}'])
        assert (out.content, out.tool_calls, out.parse_failures) == ('{"result": 42}', [], 0)

    def test_arguments_key_and_string_arguments(self):
        out = self.parse([self.TAG, '{"name": "A", "arguments": "{\\"x\\": 1}"};{"name": "B"}'])
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("A", {"x": 1}), ("B", {})]

    def test_builtin_tool_call(self):
        out = self.parse(
            [self.TAG, 'brave_search.call(query="weather in SF", n=3)', Markup("<|eom_id|>", True)]
        )
        assert [(c.name, c.arguments) for c in out.tool_calls] == [
            ("brave_search", {"query": "weather in SF", "n": 3})
        ]
        assert out.parse_failures == 0


class TestHarmony(ParserSuite):
    tools = "harmony"
    reasoning = "harmony"
    S, C, M, E = (
        Markup("<|start|>", True),
        Markup("<|channel|>", True),
        Markup("<|message|>", True),
        Markup("<|end|>", True),
    )
    CALL, RET, CON = Markup("<|call|>", True), Markup("<|return|>", True), Markup("<|constrain|>", True)
    malformed: ClassVar[list[list[Piece]]] = [
        ["plain text without any header"],
        [C, "analysis", M, "fine", E, "junk between messages", S, "assistant", C, "final", M, "x", RET],
        [C, "commentary to=functions.Bash ", CON, "json", M, "{not json", CALL],
        [C, "commentary to=browser.search ", CON, "json", M, '{"q": "x"}', CALL],  # not a function
        [C, "commentary to=functions.Bash ", CON, "json", M, '{"command": "l'],  # cut before <|call|>
        [C, "final", M, "answer", E, S, "user", M, "made-up user turn", E],
        [C, "final", M, "a", S, "b", RET],  # markup inside a message
    ]

    @pytest.fixture(autouse=True)
    def _vocab(self, harmony_vocab):
        pass

    def render(self, reasoning, content, calls):
        msgs: list[tuple[str, str, Markup]] = []
        if reasoning is not None:
            msgs.append(("analysis", reasoning, self.E))
        if content and calls:
            msgs.append(("commentary", content, self.E))  # a preamble before the calls
        for name, args in calls:
            msgs.append(
                (
                    f"commentary to=functions.{name} <|constrain|>json",
                    json.dumps(args, ensure_ascii=False),
                    self.CALL,
                )
            )
        if not calls:
            msgs.append(("final", content, self.RET))
        out: list[Piece] = []
        for k, (header, text, end) in enumerate(msgs):
            head: list[Piece] = split_markup(header, ["<|constrain|>"])
            head = [Markup(p.text, True) if isinstance(p, Markup) else p for p in head]
            out += ([] if k == 0 else [self.S, "assistant"]) + [self.C, *head, self.M, text, end]
        return out

    def kept_text(self, bad):
        """Header text (channel, recipient) is structure; what follows ``<|message|>`` or
        stands outside any message is the model's text."""
        return [
            p for k, p in enumerate(bad) if isinstance(p, str) and (k == 0 or bad[k - 1] in (self.M, self.E))
        ]

    def test_recipient_in_the_role_header(self):
        out = self.parse(
            [
                self.C,
                "analysis",
                self.M,
                "r",
                self.E,
                self.S,
                "assistant to=functions.Read",
                self.C,
                "commentary ",
                self.CON,
                "json",
                self.M,
                '{"path": "a"}',
                self.CALL,
            ]
        )
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("Read", {"path": "a"})]
        assert out.reasoning == "r" and out.parse_failures == 0

    def test_truncated_final_answer_is_kept(self):
        out = self.parse([self.C, "final", self.M, "half an ans"])
        assert (out.content, out.parse_failures) == ("half an ans", 0)


# ------------------------------------------------------------------ fixtures


def _literal_ids(tok, text: str) -> list[int]:
    """``text`` as ordinary tokens, even where it spells an added token (then one character
    at a time, so no added token matches)."""
    if any(t in text for t in tok.get_added_vocab()):
        return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture(scope="module")
def markup_tok(tiny_model_dir):
    """The tiny tokenizer plus every family's markup as single added tokens, as in the
    families' own tokenizers (control tokens special, the tiny one's markup not)."""
    from tokenizers import AddedToken

    from tests.proxy._support import load_tokenizer

    t = load_tokenizer(tiny_model_dir)
    every: set[str] = set()
    for name in TOOL_PARSERS.names():
        every |= markup_of("think", name)
    new = sorted(every - set(t.get_vocab()))
    t.add_tokens([AddedToken(m, special=True, normalized=False) for m in new], special_tokens=True)
    return t
