"""``parse_output``: generated text -> ``ParsedOutput`` (reasoning, content, tool calls)."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from proxy.chat import ParsedOutput, ToolCall, ToolSpec
from proxy.parsers._reasoning import ReasoningParser
from proxy.parsers._registry import Registry
from proxy.parsers._tools import ToolParser

REASONING_PARSERS: Registry[type[ReasoningParser]] = Registry(
    "reasoning parser",
    {
        "think": "proxy.parsers._reasoning:ThinkReasoningParser",
    },
)
TOOL_PARSERS: Registry[type[ToolParser]] = Registry(
    "tool parser",
    {
        "hermes": "proxy.parsers._tools:HermesToolParser",
        "qwen3_coder": "proxy.parsers._tools:Qwen3CoderToolParser",
    },
)


def _random_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def parse_output(
    text: str,
    *,
    reasoning: str | None = "think",
    tools: str | None = "hermes",
    tool_call_id_factory: Callable[[], str] = _random_call_id,
    tool_specs: list[ToolSpec] | None = None,
) -> ParsedOutput:
    """Split generated ``text`` with the named parsers (None disables that stage).

    Reasoning is split off first, tool calls are then extracted from the rest. ``content``
    is the remaining text stripped of surrounding whitespace (the template puts newlines
    between content and markup). Malformed tool calls stay in ``content`` and are counted in
    ``parse_failures``. Never raises for any ``text``; unknown parser names raise ``KeyError``.
    ``tool_call_id_factory`` is called once per extracted call, in order.
    """
    reasoning_text: str | None = None
    rest = text
    if reasoning is not None:
        reasoning_text, rest = REASONING_PARSERS.get(reasoning)().split(rest)
    if tools is None:
        return ParsedOutput(content=rest.strip(), reasoning=reasoning_text)
    extracted = TOOL_PARSERS.get(tools)().extract(rest, tool_specs)
    calls = [ToolCall(id=tool_call_id_factory(), name=n, arguments=a) for n, a in extracted.calls]
    return ParsedOutput(
        content=extracted.content.strip(),
        reasoning=reasoning_text,
        tool_calls=calls,
        parse_failures=extracted.failures,
    )
