"""proxy.parsers: registry, reasoning parser, tool parsers (one shared suite per format)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.parsers import REASONING_PARSERS, TOOL_PARSERS, Registry, parse_output

# ------------------------------------------------------------------ registry


def test_unknown_name_lists_available():
    with pytest.raises(KeyError, match="available: hermes, qwen3_coder"):
        TOOL_PARSERS.get("nope")
    with pytest.raises(KeyError, match="available: think"):
        parse_output("x", reasoning="deepseek")


def test_registry_imports_lazily_and_validates_targets():
    reg: Registry[Any] = Registry("thing", {"broken": "no_such_module_xyz:Thing"})
    assert reg.names() == ["broken"] and "broken" in reg  # registering did not import
    with pytest.raises(ModuleNotFoundError):
        reg.get("broken")
    reg.register("json", "json:dumps")
    assert reg.get("json") is json.dumps
    with pytest.raises(ValueError):
        reg.register("bad", "json.dumps")


# ------------------------------------------------------------------ reasoning

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
    assert think.split(text) == (reasoning, rest)


# ------------------------------------------------------------------ tool parsers: shared suite

# The shared suite runs the same hypothesis tests once per subclass, on purpose.
_SHARED = {"deadline": None, "suppress_health_check": [HealthCheck.differing_executors]}


class ToolParserSuite:
    """Every tool-call format inherits these tests; subclasses say how a call is written."""

    name: str

    def call(self, name: str, args: dict[str, Any]) -> str:
        raise NotImplementedError

    malformed: ClassVar[list[str]] = []

    def parse(self, text: str, **kw):
        ids = iter(range(1000))
        return parse_output(
            text, reasoning=None, tools=self.name, tool_call_id_factory=lambda: f"id{next(ids)}", **kw
        )

    def test_single_call_with_content(self):
        out = self.parse("Let me look.\n" + self.call("Bash", {"command": "ls -la"}))
        assert out.content == "Let me look."
        assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == [
            ("id0", "Bash", {"command": "ls -la"})
        ]
        assert out.parse_failures == 0

    def test_several_calls_keep_order(self):
        text = self.call("Read", {"path": "a"}) + "\n" + self.call("Read", {"path": "b"})
        out = self.parse(text)
        assert [c.arguments["path"] for c in out.tool_calls] == ["a", "b"]
        assert [c.id for c in out.tool_calls] == ["id0", "id1"] and out.content == ""

    def test_plain_text_untouched(self):
        out = self.parse("  just text, no calls </tool_call> here ")
        assert out.content == "just text, no calls </tool_call> here" and out.tool_calls == []

    def test_malformed_calls_stay_in_content_and_are_counted(self):
        good = self.call("Bash", {"command": "pwd"})
        for bad in self.malformed:
            out = self.parse("before " + bad + " " + good)
            assert bad.strip() in out.content, bad
            assert out.parse_failures == 1, bad
            assert [c.name for c in out.tool_calls] == ["Bash"], bad

    def test_unclosed_call_is_a_failure(self):
        out = self.parse("x " + self.call("Bash", {"command": "ls"}).removesuffix("</tool_call>"))
        assert out.tool_calls == [] and out.parse_failures == 1 and "<tool_call>" in out.content

    @settings(max_examples=200, **_SHARED)
    @given(
        st.one_of(
            st.text(),
            st.lists(
                st.sampled_from(
                    list('ab{}[]":,=\n ')
                    + [
                        "<tool_call>",
                        "</tool_call>",
                        "<function=",
                        "</function>",
                        "<parameter=",
                        "</parameter>",
                        ">",
                        "<think>",
                        "</think>",
                        '"name"',
                        '"arguments"',
                    ]
                )
            ).map("".join),
        )
    )
    def test_arbitrary_text_never_raises(self, text):
        out = self.parse(text)
        assert out.parse_failures >= 0 and len(out.tool_calls) <= text.count("<tool_call>")

    def test_deeply_nested_json_does_not_raise(self):
        out = self.parse("<tool_call>" + "[" * 100_000 + "</tool_call>")
        assert out.parse_failures == 1 and out.tool_calls == []

    _value = st.one_of(
        st.integers(-100, 100),
        st.text("abc xyz", min_size=1, max_size=8).filter(str.strip),
        st.booleans(),
        st.lists(st.integers(0, 3), max_size=2),
    )

    @settings(max_examples=100, **_SHARED)
    @given(
        pieces=st.lists(
            st.one_of(
                st.text("abc xyz.\n", max_size=12).map(lambda t: ("text", t)),
                st.tuples(
                    st.sampled_from(["Bash", "Read"]),
                    st.dictionaries(st.sampled_from(["path", "command", "n"]), _value, max_size=2),
                ).map(lambda c: ("call", c)),
            ),
            max_size=6,
        )
    )
    def test_where_text_is_split_between_calls_does_not_matter(self, pieces):
        """Calls come out in order whatever text surrounds them; the text between is the content."""
        text = "".join(p if kind == "text" else self.call(*p) for kind, p in pieces)
        out = self.parse(text)
        assert [(c.name, c.arguments) for c in out.tool_calls] == [p for kind, p in pieces if kind == "call"]
        assert out.content == "".join(p for kind, p in pieces if kind == "text").strip()
        assert out.parse_failures == 0


class TestHermes(ToolParserSuite):
    name = "hermes"
    malformed: ClassVar[list[str]] = [
        "<tool_call>\n{not json}\n</tool_call>",
        '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>',  # missing name
        '<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "X", "arguments": [1, 2]}\n</tool_call>',  # arguments not an object
        '<tool_call>\n["name", "X"]\n</tool_call>',
    ]

    def call(self, name, args):
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"

    def test_string_arguments_and_missing_arguments(self):
        out = self.parse(
            '<tool_call>{"name": "A", "arguments": "{\\"x\\": 1}"}</tool_call>'
            '<tool_call>{"name": "B"}</tool_call>'
        )
        assert [(c.name, c.arguments) for c in out.tool_calls] == [("A", {"x": 1}), ("B", {})]


class TestQwen3Coder(ToolParserSuite):
    name = "qwen3_coder"
    malformed: ClassVar[list[str]] = [
        "<tool_call>\n<function=>\n</function>\n</tool_call>",  # empty name
        "<tool_call>\n<parameter=a>\n1\n</parameter>\n</tool_call>",  # no function
        "<tool_call>\n<function=X>\n<parameter=a>\n1\n</function>\n</tool_call>",  # unclosed parameter
        "<tool_call>\n<function=X>\nstray text\n</function>\n</tool_call>",
    ]

    def call(self, name, args):
        params = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in args.items()
        )
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    def test_values_json_when_they_parse_else_strings(self):
        text = self.call("Edit", {}).replace(
            "</function>",
            "<parameter=n>\n42\n</parameter>\n<parameter=s>\nhello world\n</parameter>\n"
            "<parameter=code>\ndef f():\n    return 1\n\n</parameter>\n</function>",
        )
        (call,) = self.parse(text).tool_calls
        assert call.arguments == {"n": 42, "s": "hello world", "code": "def f():\n    return 1\n"}

    def test_schema_string_parameters_stay_strings(self):
        specs = [
            {
                "type": "function",
                "function": {
                    "name": "Bash",
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                    },
                },
            }
        ]
        text = (
            "<tool_call>\n<function=Bash>\n<parameter=command>\n42\n</parameter>\n"
            "<parameter=timeout>\n42\n</parameter>\n</function>\n</tool_call>"
        )
        (call,) = self.parse(text, tool_specs=specs).tool_calls
        assert call.arguments == {"command": "42", "timeout": 42}


# ------------------------------------------------------------------ parse_output


def test_parse_output_reasoning_then_tools():
    text = '<think>\nI should list.\n</think>\n\nListing.\n<tool_call>\n{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call>'
    out = parse_output(text, tool_call_id_factory=lambda: "toolu_1")
    assert out.reasoning == "I should list." and out.content == "Listing."
    assert [(c.id, c.name, c.arguments) for c in out.tool_calls] == [("toolu_1", "Bash", {"command": "ls"})]


def test_tool_call_inside_reasoning_is_not_a_call():
    text = '<think>maybe <tool_call>{"name": "Bash", "arguments": {}}</tool_call></think>no call'
    out = parse_output(text)
    assert out.tool_calls == [] and out.content == "no call" and "<tool_call>" in out.reasoning


def test_parsers_can_be_disabled():
    text = '<think>r</think><tool_call>{"name": "A", "arguments": {}}</tool_call>'
    assert parse_output(text, reasoning=None, tools=None).content == text
    default_ids = parse_output(text).tool_calls[0].id
    assert default_ids.startswith("call_")
