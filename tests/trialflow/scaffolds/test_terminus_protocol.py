"""The terminus agent's keystrokes -> tmux send-keys calls."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trialflow.scaffolds._terminus_protocol import KeyChunk, keystroke_plan


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
