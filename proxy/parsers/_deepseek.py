"""``deepseek_v31``: DeepSeek-V3.1 tool calls.

    CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{JSON args}<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(no whitespace between the parts in the template; whitespace the model adds between calls is
tolerated). Text outside the calls block is content. Each call is the unit of failure: a call
whose name is empty, whose arguments are not a JSON object, or that is not closed stays in
the content verbatim and counts once; a calls block that is not closed counts once more (its
complete calls are kept). A call marker outside a calls block is malformed too.
Reasoning follows the ``think`` rules: in thinking mode the template ends the prompt with
``<think>`` (the output is ``REASONING</think>ANSWER``), in non-thinking mode with ``</think>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from proxy.chat import ToolSpec
from proxy.parsers._pieces import Markup, Piece, is_blank, is_tag, text_of
from proxy.parsers._tools import Call, ExtractedCalls, loads

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


class DeepSeekV31ToolParser:
    markup: ClassVar[frozenset[str]] = frozenset({CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP})

    def extract(self, pieces: Sequence[Piece], tool_specs: list[ToolSpec] | None = None) -> ExtractedCalls:
        out = ExtractedCalls(content="")
        text: list[Piece] = []
        i, n = 0, len(pieces)
        while i < n:
            p = pieces[i]
            if is_tag(p, CALL_BEGIN) or is_tag(p, CALL_END) or is_tag(p, SEP) or is_tag(p, CALLS_END):
                out.failures += 1  # call markup outside a calls block
                text.append(p)
                i += 1
                continue
            if not is_tag(p, CALLS_BEGIN):
                text.append(p)
                i += 1
                continue
            i = self._block(pieces, i + 1, out, text)
        out.content = text_of(text)
        return out

    def _block(self, pieces: Sequence[Piece], i: int, out: ExtractedCalls, text: list[Piece]) -> int:
        """Parse calls from ``pieces[i:]`` (just after CALLS_BEGIN); return where the block ends."""
        n = len(pieces)
        while i < n:
            p = pieces[i]
            if is_blank(p):
                i += 1
            elif is_tag(p, CALLS_END):
                return i + 1
            elif is_tag(p, CALL_BEGIN):
                end = next((j for j in range(i + 1, n) if is_tag(pieces[j], CALL_END)), None)
                stop = next((j for j in range(i + 1, n) if is_tag(pieces[j], CALLS_END)), n)
                if end is None or end > stop:  # unclosed call
                    out.failures += 1
                    text.extend(pieces[i:stop])
                    i = stop
                    continue
                call = _call(list(pieces[i + 1 : end]))
                if call is None:
                    out.failures += 1
                    text.extend(pieces[i : end + 1])
                else:
                    out.calls.append(call)
                i = end + 1
            else:  # stray text or markup inside the block
                out.failures += 1
                nxt = next(
                    (
                        j
                        for j in range(i + 1, n)
                        if is_tag(pieces[j], CALL_BEGIN) or is_tag(pieces[j], CALLS_END)
                    ),
                    n,
                )
                text.extend(pieces[i:nxt])
                i = nxt
        out.failures += 1  # the calls block was never closed
        return n


def _call(body: list[Piece]) -> Call | None:
    sep = next((k for k, p in enumerate(body) if is_tag(p, SEP)), None)
    if sep is None or any(isinstance(p, Markup) for p in body[:sep]):
        return None
    name = text_of(body[:sep]).strip()
    try:
        args = loads(text_of(body[sep + 1 :]))
    except ValueError:
        return None
    if not name or not isinstance(args, dict):
        return None
    return name, args
