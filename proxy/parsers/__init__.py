"""Reasoning and tool-call parsers (pure).

Public API:

    OutputDecoder(tokenizer, markup).decode(token_ids) -> list[Piece]   (text and Markup tokens)
    parse_output(text_or_pieces, *, reasoning="think", tools="hermes", tool_call_id_factory=...,
                 tool_specs=None, started_inside_reasoning=False) -> proxy.chat.ParsedOutput
    markup_of(reasoning, tools) -> frozenset[str]      the markup strings those parsers use
    check_parsers(reasoning, tools)   KeyError (unknown name) / HarmonyUnavailable, at start-up
    text_of(pieces) -> str, strip_text_suffix(pieces, suffix) -> pieces
    starts_inside_reasoning(prompt_tail_pieces, reasoning) -> bool
    REASONING_PARSERS: Registry   names: "think"
    TOOL_PARSERS: Registry        names: "deepseek_v31", "glm45", "harmony", "hermes",
                                  "llama3_json", "qwen3_coder"
    Registry                      generic lazy-import registry (KeyError lists available names)
    ExtractedCalls, Markup, Piece, HarmonyUnavailable
    use_vocabulary(directory)     where harmony reads its o200k_base vocabulary (entry points call it)

See ``_pieces`` for why parsers see markup tokens apart from text, and each format's module
(``_reasoning``, ``_tools``, ``_deepseek``, ``_llama``, ``_harmony``) for its exact rules.
"""

from proxy.parsers._harmony import HarmonyUnavailable, use_vocabulary
from proxy.parsers._output import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    check_parsers,
    markup_of,
    parse_output,
    starts_inside_reasoning,
)
from proxy.parsers._pieces import Markup, OutputDecoder, Piece, strip_text_suffix, text_of
from proxy.parsers._tools import ExtractedCalls
from proxy.registry import Registry

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "ExtractedCalls",
    "HarmonyUnavailable",
    "Markup",
    "OutputDecoder",
    "Piece",
    "Registry",
    "check_parsers",
    "markup_of",
    "parse_output",
    "starts_inside_reasoning",
    "strip_text_suffix",
    "text_of",
    "use_vocabulary",
]
