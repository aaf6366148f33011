"""The Terminus text protocol: reply parsing, keystroke splitting, prompt text."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trialflow.scaffolds._terminus_protocol import (
    DEFAULT_DURATION_S,
    AgentReply,
    Command,
    KeyChunk,
    ReplyParseError,
    confirm_message,
    correction_message,
    extract_json_object,
    keystroke_plan,
    parse_reply,
    screen_message,
    system_prompt,
)


def test_plain_reply():
    text = json.dumps(
        {
            "analysis": "empty dir",
            "plan": "create it",
            "commands": [{"keystrokes": "echo hi > a.txt\n", "duration": 0.5}],
            "task_complete": False,
        }
    )
    assert parse_reply(text) == AgentReply(
        "empty dir", "create it", (Command("echo hi > a.txt\n", 0.5),), False
    )


def test_fenced_reply_with_prose_and_stray_braces():
    text = 'Sure {not json}. Here:\n```json\n{"commands": [{"keystrokes": "echo \'{}\'\\n"}], "task_complete": true}\n```\nbye'
    reply = parse_reply(text)
    assert reply.commands == (Command("echo '{}'\n", DEFAULT_DURATION_S),)
    assert reply.task_complete is True
    assert reply.analysis == "" and reply.plan == ""


def test_first_object_wins_and_nested_lists_are_not_objects():
    assert extract_json_object('[1, 2] {"a": 1} {"b": 2}') == {"a": 1}


@pytest.mark.parametrize("text", ["", "no json here", "[1, 2]", '{"unterminated": '])
def test_no_object(text):
    with pytest.raises(ReplyParseError, match="no JSON object"):
        parse_reply(text)


def test_missing_or_null_commands_mean_none():
    assert parse_reply('{"task_complete": true}').commands == ()
    assert parse_reply('{"commands": null}') == AgentReply("", "", (), False)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"commands": "ls\n"}, "'commands' must be a list"),
        ({"commands": ["ls\n"]}, r"commands\[0\] must be an object"),
        ({"commands": [{"duration": 1}]}, r"commands\[0\].keystrokes must be a string"),
        ({"commands": [{"keystrokes": "a"}, {"keystrokes": 5}]}, r"commands\[1\].keystrokes"),
        ({"commands": [{"keystrokes": "a", "duration": "1"}]}, "duration must be a number"),
        ({"commands": [{"keystrokes": "a", "duration": True}]}, "duration must be a number"),
        ({"task_complete": "true"}, "'task_complete' must be true or false"),
        ({"analysis": ["x"]}, "'analysis' must be a string"),
    ],
)
def test_invalid_fields(obj, message):
    with pytest.raises(ReplyParseError, match=message):
        parse_reply(json.dumps(obj))


def test_non_finite_duration_is_rejected():
    with pytest.raises(ReplyParseError, match="duration"):
        parse_reply('{"commands": [{"keystrokes": "a", "duration": NaN}]}')


def test_duration_clamped():
    reply = parse_reply(
        '{"commands": [{"keystrokes": "a", "duration": -3}, {"keystrokes": "b", "duration": 999}]}',
        max_duration_s=10,
    )
    assert [c.duration_s for c in reply.commands] == [0.0, 10.0]


def test_default_duration_respects_max():
    assert (
        parse_reply('{"commands": [{"keystrokes": "a"}]}', max_duration_s=0.2).commands[0].duration_s == 0.2
    )


@pytest.mark.parametrize("key", ["C-c", "C-d", "M-x", "Enter", "Escape", "Up", "F5", "C-\\", "Tab"])
def test_key_names_are_sent_as_keys(key):
    assert keystroke_plan(key) == [KeyChunk(key, literal=False)]


def test_text_is_literal_and_newlines_press_enter():
    assert keystroke_plan("ls -la\n") == [KeyChunk("ls -la", True), KeyChunk("Enter", False)]
    assert keystroke_plan("a\n\nb") == [
        KeyChunk("a", True),
        KeyChunk("Enter", False),
        KeyChunk("Enter", False),
        KeyChunk("b", True),
    ]
    # Words that merely contain a key name are text.
    assert keystroke_plan("Enter the dir") == [KeyChunk("Enter the dir", True)]
    assert keystroke_plan("") == []


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
def test_plan_reassembles_to_the_input(text):
    plan = keystroke_plan(text)
    if plan == [KeyChunk(text, literal=False)]:
        return
    rebuilt = "".join(c.text if c.literal else "\n" for c in plan)
    assert rebuilt == text
    assert all(c.text for c in plan)


@given(
    st.lists(st.tuples(st.text(max_size=20), st.floats(0, 60)), max_size=4),
    st.booleans(),
    st.text(max_size=30),
)
def test_roundtrip_of_any_valid_reply(cmds, done, analysis):
    obj = {
        "analysis": analysis,
        "commands": [{"keystrokes": k, "duration": d} for k, d in cmds],
        "task_complete": done,
    }
    reply = parse_reply("model says:\n" + json.dumps(obj))
    assert reply == AgentReply(analysis, "", tuple(Command(k, d) for k, d in cmds), done)


def test_prompt_texts():
    prompt = system_prompt("  Create /app/a.txt  \n", max_duration_s=30)
    assert prompt.rstrip().endswith("Create /app/a.txt")
    assert '"keystrokes"' in prompt and "max 30" in prompt
    # The example in the prompt follows the protocol itself.
    assert parse_reply(prompt).commands == (Command("ls -la\n", 0.5),)
    assert screen_message("x" * 50, max_chars=10).endswith("x" * 10)
    assert "earlier output cut" in screen_message("x" * 50, max_chars=10)
    assert "confirm" not in correction_message(ReplyParseError("bad")) and "bad" in correction_message(
        ReplyParseError("bad")
    )
    assert "task_complete" in confirm_message("$ ")
