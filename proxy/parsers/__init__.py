"""Reasoning and tool-call parsers (pure).

Public API:

    parse_output(text, *, reasoning="think", tools="hermes", tool_call_id_factory=..., tool_specs=None)
        -> proxy.chat.ParsedOutput
    REASONING_PARSERS: Registry   names: "think"            (instances: .split(text) -> (reasoning|None, rest))
    TOOL_PARSERS: Registry        names: "hermes", "qwen3_coder"
                                  (instances: .extract(text, tool_specs=None) -> ExtractedCalls)
    Registry                      generic lazy-import registry (KeyError lists available names)
    ExtractedCalls

See ``_reasoning`` and ``_tools`` for the exact formats and edge cases.
"""

from proxy.parsers._output import REASONING_PARSERS, TOOL_PARSERS, parse_output
from proxy.parsers._registry import Registry
from proxy.parsers._tools import ExtractedCalls

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "ExtractedCalls", "Registry", "parse_output"]
