"""Generated output as pieces: ordinary text, and markup tokens kept apart from it.

Why: a family's markup (``<tool_call>``, ``<arg_key>``, ``<｜tool▁sep｜>``, harmony's
``<|channel|>``) is a single token id in the family's tokenizer. Decoding with
``skip_special_tokens=True`` throws some of it away (GLM, harmony), and decoding to one string
makes a literal ``</tool_call>`` the model typed as ordinary BPE pieces (say, inside a file it
writes) indistinguishable from the real token. So the parsers see a list of pieces:

- ``str``: ordinary text (the decoded run of non-added ids between two markup tokens);
- ``Markup(text, special)``: one added token of the tokenizer (``special`` as the tokenizer
  marks it: control tokens such as EOS are special, Qwen's ``<tool_call>`` is not).

``OutputDecoder(tokenizer, markup)`` turns token ids into pieces. A markup string a parser
needs that the tokenizer has NOT as one added token (a tokenizer that spells it with BPE
pieces) is split out of the decoded text instead, so the parsers work either way. Text given
as one string (``split_markup``) is split on every markup string: there the two cannot be told
apart. Multi-byte characters split across tokens decode correctly because each run of
ordinary ids is decoded as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Markup:
    """One markup token; ``text`` is its content (what a decode keeping it would show)."""

    text: str
    special: bool = False


Piece = str | Markup


def is_tag(piece: Piece, text: str) -> bool:
    """Whether ``piece`` is the markup token ``text`` (never true for ordinary text)."""
    return isinstance(piece, Markup) and piece.text == text


def is_blank(piece: Piece) -> bool:
    return isinstance(piece, str) and not piece.strip()


def text_of(pieces: Iterable[Piece]) -> str:
    """The pieces as one string (markup spelled out)."""
    return "".join(p if isinstance(p, str) else p.text for p in pieces)


def merged(pieces: Iterable[Piece]) -> list[Piece]:
    """Adjacent text pieces joined, empty text dropped (parsers never see a text boundary)."""
    out: list[Piece] = []
    for p in pieces:
        if isinstance(p, str):
            if not p:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += p
                continue
        out.append(p)
    return out


def split_markup(text: str, markup: Iterable[str]) -> list[Piece]:
    """``text`` with every occurrence of a ``markup`` string made a ``Markup`` piece
    (longest match first where two start at the same place)."""
    tags = sorted({m for m in markup if m}, key=len, reverse=True)
    if not tags:
        return [text] if text else []
    out: list[Piece] = []
    pos = start = 0
    while pos < len(text):
        tag = next((t for t in tags if text.startswith(t, pos)), None)
        if tag is None:
            nxt = min((i for t in tags if (i := text.find(t, pos + 1)) != -1), default=len(text))
            pos = nxt
            continue
        if start < pos:
            out.append(text[start:pos])
        out.append(Markup(tag))
        pos = start = pos + len(tag)
    if start < len(text):
        out.append(text[start:])
    return out


def strip_text_suffix(pieces: Sequence[Piece], suffix: str) -> list[Piece]:
    """``pieces`` without their last ``len(suffix)`` characters (a client stop string the
    backend left in the output). A markup piece the cut reaches is removed whole."""
    out = list(pieces)
    left = len(suffix)
    while left > 0 and out:
        last = out.pop()
        text = last if isinstance(last, str) else last.text
        if len(text) > left and isinstance(last, str):
            out.append(last[:-left])
        left -= len(text)
    return out


class OutputDecoder:
    """Token ids -> pieces for one tokenizer (see module docstring). ``markup``: the markup
    strings the session's parsers use (``proxy.parsers.markup_of``)."""

    def __init__(self, tokenizer: Any, markup: Iterable[str] = ()) -> None:
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._added: dict[int, Markup] = {
            int(i): Markup(str(t.content), bool(getattr(t, "special", False))) for i, t in added.items()
        }
        contents = {m.text for m in self._added.values()}
        self._text_markup = frozenset(m for m in markup if m not in contents)
        # The Rust decoder directly: transformers' decode() walks every id in Python first.
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode_run: Callable[[list[int]], str] = (
            (lambda ids: backend.decode(ids, skip_special_tokens=False))
            if backend is not None
            else (lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        )

    def decode(self, ids: Sequence[int]) -> list[Piece]:
        out: list[Piece] = []
        run: list[int] = []
        for i in ids:
            mark = self._added.get(i)
            if mark is None:
                run.append(i)
                continue
            if run:
                out.extend(self._text(run))
                run = []
            out.append(mark)
        if run:
            out.extend(self._text(run))
        return out

    def _text(self, run: list[int]) -> list[Piece]:
        text = self._decode_run(run)
        return split_markup(text, self._text_markup) if self._text_markup else [text]
