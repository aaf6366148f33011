"""Terminus-2's reply parsing and messages (trialflow.scaffolds._terminus2) against the rules of
Harbor 0.25's json-plain parser and agent loop, awkward cases included."""

from __future__ import annotations

import json

import pytest

from trialflow.scaffolds import _terminus2 as t2


def reply(**fields) -> str:
    return json.dumps({"analysis": "a", "plan": "p", "commands": [], **fields})


def test_a_plain_reply():
    r = t2.parse_response(reply(commands=[{"keystrokes": "ls\n", "duration": 0.1}], task_complete=False))
    assert (r.error, r.warning, r.task_complete) == ("", "", False)
    assert r.commands == (t2.Command("ls\n", 0.1),) and (r.analysis, r.plan) == ("a", "p")


def test_extra_text_and_missing_duration_are_warnings():
    r = t2.parse_response(
        "Sure!\n" + reply(commands=[{"keystrokes": "ls"}, {"keystrokes": "pwd\n"}]) + "\nbye"
    )
    assert r.error == "" and r.commands[0].duration == 1.0
    assert r.warning.splitlines() == [
        "- Extra text detected before JSON object",
        "- Extra text detected after JSON object",
        "- Command 1: Missing duration field, using default 1.0",
        "- Command 1 should end with newline when followed by another command. Otherwise the two "
        "commands will be concatenated together on the same line.",
        "- Command 2: Missing duration field, using default 1.0",
    ]


@pytest.mark.parametrize(
    "text, error",
    [
        ("no json here", "No valid JSON found in response"),
        ('{"analysis": "a", "plan": "p"}', "Missing required fields: commands"),
        ('{"plan": "p"}', "Missing required fields: analysis, commands"),
        (reply(commands="ls"), "Field 'commands' must be an array"),
        (reply(commands=["ls"]), "Command 1 must be an object"),
        (reply(commands=[{"duration": 1}]), "Command 1 missing required 'keystrokes' field"),
        (reply(commands=[{"keystrokes": 5}]), "Command 1 'keystrokes' must be a string"),
        ('{"analysis": "a", "plan": "p", "commands": [}', "Invalid JSON"),
    ],
)
def test_errors(text, error):
    r = t2.parse_response(text)
    assert r.error.startswith(error) and r.commands == () and not r.task_complete


def test_task_complete_forms_and_command_errors_when_complete():
    assert t2.parse_response(reply(task_complete="Yes")).task_complete is True
    assert t2.parse_response(reply(task_complete="nope")).task_complete is False
    r = t2.parse_response(reply(task_complete=True, commands=[{"keystrokes": 1}]))
    assert r.error == "" and r.task_complete and r.commands == () and "must be a string" in r.warning
    assert "should be a boolean or string" in t2.parse_response(reply(task_complete=1)).warning


def test_auto_fix_adds_missing_braces():
    r = t2.parse_response(
        '{"analysis": "a", "plan": "p", "commands": [{"keystrokes": "ls\\n", "duration": 1}]'
    )
    assert r.error == "" and r.commands == (t2.Command("ls\n", 1.0),)
    assert r.warning.startswith("- AUTO-CORRECTED: Fixed incomplete JSON by adding missing closing brace")


def test_field_order_and_types_warn():
    text = '{"commands": [], "plan": 3, "analysis": "a"}'
    r = t2.parse_response(text)
    assert r.error == ""
    assert "- Field 'plan' should be a string" in r.warning
    order = "Found: commands → plan → analysis, expected: analysis → plan → commands"
    assert f"Fields appear in wrong order. {order}" in r.warning


def test_output_limit_keeps_head_and_tail():
    out = "x" * 6000 + "y" * 6000
    limited = t2.limit_output_length(out)
    assert limited.startswith("x" * 5000) and limited.endswith("y" * 5000)
    assert "[... output limited to 10000 bytes; 2000 interior bytes omitted ...]" in limited
    assert t2.limit_output_length("short") == "short"


def test_messages():
    prompt = t2.initial_prompt("Make hello.txt", "Current Terminal Screen:\n$ ")
    assert prompt.startswith("You are an AI assistant tasked with solving command-line tasks")
    assert prompt.endswith(
        "Task Description:\nMake hello.txt\n\nCurrent terminal state:\nCurrent Terminal Screen:\n$ \n"
    )
    assert '{\n  "analysis"' in prompt and '"keystrokes": "ls -la\\n"' in prompt
    bad = t2.parse_response("{")
    assert t2.error_prompt(bad).startswith("Previous response had parsing errors:\nERROR: ")
    assert t2.error_prompt(bad).endswith("Please fix these issues and provide a proper JSON response.")
    confirm = t2.confirmation_message("$ ls")
    assert confirm.startswith(
        "Current terminal state:\n$ ls\n\nAre you sure you want to mark the task as complete?"
    )
    assert confirm.endswith('include "task_complete": true in your JSON response again.')
    warned = t2.parse_response(reply(commands=[{"keystrokes": "ls\n"}]))
    assert t2.observation(warned, "out").startswith("Previous response had warnings:\nWARNINGS: - Command 1")


def test_incremental_output():
    assert t2.incremental_output(None, "$ ls\na\n", "VIS") == "Current Terminal Screen:\nVIS"
    assert t2.incremental_output("$ ", "$ ls\na b\n$ ", "VIS") == "New Terminal Output:\n$ ls\na b\n$ "
    # Harbor's cut: at the previous text's last newline, measured inside the previous text
    assert t2.incremental_output("$ ls\na\n$ ", "$ ls\na\n$ pwd\n/app\n$ ", "VIS") == (
        "New Terminal Output:\n\n$ pwd\n/app\n$ "
    )
    assert t2.incremental_output("gone", "cleared\n", "VIS") == "Current Terminal Screen:\nVIS"
