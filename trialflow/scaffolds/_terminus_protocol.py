"""The Terminus-style agent's text protocol (pure: no I/O).

The model answers every turn with one JSON object::

    {"analysis": "what the screen shows",
     "plan": "what to do next",
     "commands": [{"keystrokes": "ls -la\\n", "duration": 0.5}],
     "task_complete": false}

Parsing rules (`parse_reply`), each with its edge cases:
- The object may be wrapped in prose or a ```json fence; the first balanced top-level
  `{...}` that decodes as a JSON object is used (braces inside JSON strings are skipped).
  No such object -> `ReplyParseError`.
- `commands` missing or null -> no commands (valid: the agent may just wait or finish).
  Not a list, or an item that is not an object with a string `keystrokes` -> error.
- `duration` missing -> `DEFAULT_DURATION_S`; not a number (bools are not numbers) or not
  finite -> error; negative -> 0; above `max_duration_s` -> clamped to it.
- `task_complete` missing -> False; anything but a JSON bool -> error (a string "true"
  is ambiguous enough that the model should be told).
- `analysis` / `plan` missing -> "" ; non-string -> error.

Keystrokes (`keystroke_plan`): a string that is exactly one tmux key name (``C-c``,
``Enter``, ``Escape``, ``Up`` ...) is sent as that key; anything else is sent literally,
with each newline turned into an ``Enter`` key press so shells run the line.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_DURATION_S = 1.0
MAX_DURATION_S = 60.0

_TMUX_KEY = re.compile(
    r"^(?:[CM]-(?:[a-zA-Z0-9\\\[\]@^_]|Space)|C-M-[a-zA-Z]|Enter|Escape|Tab|BTab|BSpace|Space|DC|IC|"
    r"Up|Down|Left|Right|Home|End|NPage|PPage|PageUp|PageDown|F(?:[1-9]|1[0-2]))$"
)


class ReplyParseError(ValueError):
    """The model's reply does not follow the protocol; `str(e)` is written for the model."""


@dataclass(frozen=True)
class Command:
    keystrokes: str
    duration_s: float


@dataclass(frozen=True)
class AgentReply:
    analysis: str
    plan: str
    commands: tuple[Command, ...]
    task_complete: bool


@dataclass(frozen=True)
class KeyChunk:
    """One `tmux send-keys` call: `literal` text (``-l``) or a key name."""

    text: str
    literal: bool


def extract_json_object(text: str) -> dict[str, Any]:
    """First balanced `{...}` in `text` that decodes to a JSON object.

    Scans every `{` as a candidate start, so prose with stray braces before the real
    object does not hide it. Raises `ReplyParseError` when there is none.
    """
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            obj, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ReplyParseError("no JSON object found in your reply")


def _str_field(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ReplyParseError(f"field '{key}' must be a string, got {type(value).__name__}")
    return value


def _duration(raw: Any, index: int, max_duration_s: float) -> float:
    if raw is None:
        return min(DEFAULT_DURATION_S, max_duration_s)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise ReplyParseError(f"commands[{index}].duration must be a number of seconds, got {raw!r}")
    return min(max(float(raw), 0.0), max_duration_s)


def _commands(raw: Any, max_duration_s: float) -> tuple[Command, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ReplyParseError(f"field 'commands' must be a list, got {type(raw).__name__}")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ReplyParseError(f"commands[{i}] must be an object with 'keystrokes' and 'duration'")
        keys = item.get("keystrokes")
        if not isinstance(keys, str):
            raise ReplyParseError(f"commands[{i}].keystrokes must be a string")
        out.append(Command(keys, _duration(item.get("duration"), i, max_duration_s)))
    return tuple(out)


def parse_reply(text: str, *, max_duration_s: float = MAX_DURATION_S) -> AgentReply:
    """Parse one model reply (see the module docstring). Raises `ReplyParseError`."""
    obj = extract_json_object(text)
    done = obj.get("task_complete", False)
    if done is None:
        done = False
    if not isinstance(done, bool):
        raise ReplyParseError(f"field 'task_complete' must be true or false, got {done!r}")
    return AgentReply(
        analysis=_str_field(obj, "analysis"),
        plan=_str_field(obj, "plan"),
        commands=_commands(obj.get("commands"), max_duration_s),
        task_complete=done,
    )


def keystroke_plan(keystrokes: str) -> list[KeyChunk]:
    """Split keystrokes into `tmux send-keys` calls. "" -> []."""
    if _TMUX_KEY.match(keystrokes):
        return [KeyChunk(keystrokes, literal=False)]
    chunks: list[KeyChunk] = []
    lines = keystrokes.split("\n")
    for i, line in enumerate(lines):
        if line:
            chunks.append(KeyChunk(line, literal=True))
        if i < len(lines) - 1:
            chunks.append(KeyChunk("Enter", literal=False))
    return chunks


SYSTEM_PROMPT = """\
You are an AI agent solving a task in a Linux terminal (bash inside tmux).
Each turn you see the current terminal screen. Reply with exactly one JSON object and nothing else:

{{"analysis": "what the screen shows and what it means",
 "plan": "what you will do next",
 "commands": [{{"keystrokes": "ls -la\\n", "duration": 0.5}}],
 "task_complete": false}}

- "keystrokes" are typed into the terminal verbatim; end a command with "\\n" to run it.
  A keystrokes value that is exactly a tmux key name such as "C-c", "C-d", "Escape" or "Up"
  presses that key.
- "duration" is how many seconds to wait after the keystrokes before the next screen (max {max_duration:g}).
- Set "task_complete" to true when the task is done; you will be asked to confirm once.

Task:
{instruction}
"""


def system_prompt(instruction: str, *, max_duration_s: float = MAX_DURATION_S) -> str:
    return SYSTEM_PROMPT.format(instruction=instruction.strip(), max_duration=max_duration_s)


def screen_message(screen: str, *, max_chars: int = 8000) -> str:
    """The user message for one turn: the screen, keeping its tail when it is too long."""
    screen = screen.rstrip()
    if len(screen) > max_chars:
        screen = "[... earlier output cut ...]\n" + screen[-max_chars:]
    return f"Current terminal screen:\n{screen}"


def correction_message(error: ReplyParseError) -> str:
    return (
        f"Your last reply could not be used: {error}. Reply with exactly one JSON object with the "
        'fields "analysis", "plan", "commands" (a list of {"keystrokes", "duration"}) and "task_complete".'
    )


def confirm_message(screen: str) -> str:
    return (
        screen_message(screen)
        + '\n\nYou marked the task as complete. If it really is, reply again with "task_complete": true '
        "(the grader runs then and no further changes are possible); otherwise continue working."
    )
