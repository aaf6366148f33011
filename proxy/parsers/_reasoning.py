"""Reasoning parsers: split generated text into (reasoning, rest).

``think`` handles ``<think>...</think>``:
- text starting (after whitespace) with ``<think>``: reasoning is up to the first ``</think>``;
  with no closing tag (truncated generation) all of the remaining text is reasoning.
- text containing ``</think>`` but not starting with ``<think>``: the opening tag was in the
  prompt (generation started inside thinking), so everything before ``</think>`` is reasoning.
- otherwise there is no reasoning (None). ``<think>`` later in the text is plain content.
Reasoning is stripped of surrounding whitespace; empty reasoning becomes None. Never raises.
"""

from __future__ import annotations

from typing import Protocol


class ReasoningParser(Protocol):
    def split(self, text: str) -> tuple[str | None, str]:
        """Return ``(reasoning or None, remaining text)``."""
        ...


class ThinkReasoningParser:
    open_tag = "<think>"
    close_tag = "</think>"

    def split(self, text: str) -> tuple[str | None, str]:
        stripped = text.lstrip()
        if stripped.startswith(self.open_tag):
            inner = stripped[len(self.open_tag) :]
            reasoning, closed, rest = inner.partition(self.close_tag)
            if not closed:
                return (reasoning.strip() or None), ""
            return (reasoning.strip() or None), rest
        reasoning, closed, rest = text.partition(self.close_tag)
        if closed:
            return (reasoning.strip() or None), rest
        return None, text
