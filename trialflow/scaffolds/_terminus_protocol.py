"""How the terminus agent's keystrokes reach tmux (pure: no I/O). The reply format itself is
Terminus-2's (`_terminus2`).

`keystroke_plan`: a string that is exactly one tmux key name (``C-c``, ``Enter``, ``Escape``,
``Up`` ...) is sent as that key; anything else is sent literally (``send-keys -l``), with each
newline turned into an ``Enter`` key press so shells run the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_TMUX_KEY = re.compile(
    r"^(?:[CM]-(?:[a-zA-Z0-9\\\[\]@^_]|Space)|C-M-[a-zA-Z]|Enter|Escape|Tab|BTab|BSpace|Space|DC|IC|"
    r"Up|Down|Left|Right|Home|End|NPage|PPage|PageUp|PageDown|F(?:[1-9]|1[0-2]))$"
)


@dataclass(frozen=True)
class KeyChunk:
    """One `tmux send-keys` call: `literal` text (``-l``) or a key name."""

    text: str
    literal: bool


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
