"""``parse_output``: generated output -> ``ParsedOutput`` (reasoning, content, tool calls)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from proxy.chat import ParsedOutput, ToolCall, ToolSpec
from proxy.parsers._pieces import Markup, Piece, merged, split_markup
from proxy.parsers._reasoning import ReasoningParser
from proxy.parsers._tools import ToolParser
from proxy.registry import Registry

REASONING_PARSERS: Registry[type[ReasoningParser]] = Registry(
    "reasoning parser",
    {
        "harmony": "proxy.parsers._harmony:HarmonyReasoningParser",
        "think": "proxy.parsers._reasoning:ThinkReasoningParser",
    },
)
TOOL_PARSERS: Registry[type[ToolParser]] = Registry(
    "tool parser",
    {
        "deepseek_v31": "proxy.parsers._deepseek:DeepSeekV31ToolParser",
        "glm45": "proxy.parsers._tools:Glm45ToolParser",
        "harmony": "proxy.parsers._harmony:HarmonyToolParser",
        "hermes": "proxy.parsers._tools:HermesToolParser",
        "llama3_json": "proxy.parsers._llama:Llama3JsonToolParser",
        "qwen3_coder": "proxy.parsers._tools:Qwen3CoderToolParser",
    },
)


def _random_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def markup_of(reasoning: str | None, tools: str | None) -> frozenset[str]:
    """The markup strings the named parsers use (resolving the names: ``KeyError`` for
    unknown ones, so a typo fails when a session is made)."""
    out: frozenset[str] = frozenset()
    if reasoning is not None:
        out |= REASONING_PARSERS.get(reasoning).markup
    if tools is not None:
        out |= TOOL_PARSERS.get(tools).markup
    return out


def check_parsers(reasoning: str | None, tools: str | None) -> None:
    """Make the named parsers once: ``KeyError`` for an unknown name, ``HarmonyUnavailable``
    when harmony's vocabulary cannot be loaded (so a proxy or session fails when it is made),
    ``ValueError`` for reasoning ``harmony`` without tools ``harmony`` (one parse reads both)."""
    if reasoning == "harmony" and tools != "harmony":
        raise ValueError("reasoning parser 'harmony' needs tool parser 'harmony' (the channels carry both)")
    if reasoning is not None:
        REASONING_PARSERS.get(reasoning)()
    if tools is not None:
        TOOL_PARSERS.get(tools)()


def starts_inside_reasoning(prompt_tail: Sequence[Piece], reasoning: str | None) -> bool:
    """Whether a prompt ending in ``prompt_tail`` leaves the model inside its reasoning
    (e.g. DeepSeek-V3.1's thinking mode ends the prompt with ``<think>``)."""
    return reasoning is not None and REASONING_PARSERS.get(reasoning)().starts_inside(prompt_tail)


def parse_output(
    output: str | Sequence[Piece],
    *,
    reasoning: str | None = "think",
    tools: str | None = "hermes",
    tool_call_id_factory: Callable[[], str] = _random_call_id,
    tool_specs: list[ToolSpec] | None = None,
    started_inside_reasoning: bool = False,
) -> ParsedOutput:
    """Split generated output with the named parsers (None disables that stage).

    ``output`` is either pieces from ``OutputDecoder`` (markup told apart from text by token)
    or one string (every markup string of the parsers counts as markup; see ``_pieces``).
    Before parsing, markup no parser uses is made text again: a special token there is a
    parse failure (an EOS mid-output, a stray role header), except as the last piece, where
    it is the token that ended the turn and is dropped.

    Reasoning is split off first, tool calls are then extracted from the rest. ``content``
    is the remaining text stripped of surrounding whitespace (the template puts newlines
    between content and markup). Malformed tool calls stay in ``content`` and are counted in
    ``parse_failures``. Never raises for any output; unknown parser names raise ``KeyError``.
    ``tool_call_id_factory`` is called once per extracted call, in order.
    """
    known = markup_of(reasoning, tools)
    pieces = split_markup(output, known) if isinstance(output, str) else list(output)
    pieces, failures = _unknown_markup_as_text(merged(pieces), known)
    pieces = merged(pieces)
    reasoning_text: str | None = None
    if reasoning is not None:
        reasoning_text, pieces = REASONING_PARSERS.get(reasoning)().split(
            pieces, started_inside=started_inside_reasoning
        )
    if tools is None:
        text = "".join(p if isinstance(p, str) else p.text for p in pieces)
        return ParsedOutput(content=text.strip(), reasoning=reasoning_text, parse_failures=failures)
    extracted = TOOL_PARSERS.get(tools)().extract(pieces, tool_specs)
    calls = [ToolCall(id=tool_call_id_factory(), name=n, arguments=a) for n, a in extracted.calls]
    return ParsedOutput(
        content=extracted.content.strip(),
        reasoning=reasoning_text if extracted.reasoning is None else extracted.reasoning,
        tool_calls=calls,
        parse_failures=failures + extracted.failures,
    )


def _unknown_markup_as_text(pieces: list[Piece], known: frozenset[str]) -> tuple[list[Piece], int]:
    if pieces and isinstance(pieces[-1], Markup) and pieces[-1].special and pieces[-1].text not in known:
        pieces = pieces[:-1]  # the turn's terminator (EOS, <|eom_id|>, <|observation|>, ...)
    out: list[Piece] = []
    failures = 0
    for p in pieces:
        if isinstance(p, Markup) and p.text not in known:
            failures += p.special
            out.append(p.text)
        else:
            out.append(p)
    return out, failures
