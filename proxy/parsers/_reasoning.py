"""Reasoning parsers: split generated pieces into (reasoning, rest).

``think`` handles ``<think>...</think>`` (Qwen3, GLM-4.5/4.6, DeepSeek-V3.1):
- generation started inside thinking (the prompt's last markup is ``<think>``: DeepSeek-V3.1's
  thinking mode, Qwen3-2507 thinking templates): everything up to the first ``</think>`` is
  reasoning; with no ``</think>`` (truncated) all of it is.
- output starting (after whitespace) with ``<think>``: reasoning is up to the first
  ``</think>``; with no closing tag (truncated generation) all of the remaining output is
  reasoning.
- output containing ``</think>`` but not starting with ``<think>``: the opening tag was in the
  prompt, so everything before ``</think>`` is reasoning.
- otherwise there is no reasoning (None). ``<think>`` later in the output is plain content.
Markup inside the reasoning is kept as its text. Reasoning is stripped of surrounding
whitespace; empty reasoning becomes None. Never raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol

from proxy.parsers._pieces import Markup, Piece, is_blank, is_tag, text_of


class ReasoningParser(Protocol):
    markup: ClassVar[frozenset[str]]

    def split(
        self, pieces: Sequence[Piece], *, started_inside: bool = False
    ) -> tuple[str | None, list[Piece]]:
        """Return ``(reasoning or None, the remaining pieces)``."""
        ...

    def starts_inside(self, prompt_tail: Sequence[Piece]) -> bool:
        """Whether a prompt ending in ``prompt_tail`` leaves the model inside its reasoning."""
        ...


class ThinkReasoningParser:
    open_tag = "<think>"
    close_tag = "</think>"
    markup: ClassVar[frozenset[str]] = frozenset({open_tag, close_tag})

    def starts_inside(self, prompt_tail: Sequence[Piece]) -> bool:
        for p in reversed(prompt_tail):
            if isinstance(p, Markup):
                return p.text == self.open_tag
            if p.strip():
                return False
        return False

    def split(
        self, pieces: Sequence[Piece], *, started_inside: bool = False
    ) -> tuple[str | None, list[Piece]]:
        pieces = list(pieces)
        close = next((i for i, p in enumerate(pieces) if is_tag(p, self.close_tag)), None)
        if not started_inside:
            first = next((i for i, p in enumerate(pieces) if not is_blank(p)), None)
            if first is not None and is_tag(pieces[first], self.open_tag):
                pieces = pieces[first + 1 :]
                close = None if close is None else close - first - 1
            elif close is None:
                return None, pieces
        if close is None:
            return (text_of(pieces).strip() or None), []
        return (text_of(pieces[:close]).strip() or None), pieces[close + 1 :]
