"""Tool-call parsers: pull well-formed tool calls out of generated pieces.

Common rules (every format; the shared test suite checks them):
- Markup is structure only where the format expects it; anywhere else (markup inside a JSON
  string, a ``<think>`` in a file being written) it is its text.
- A call that is malformed (bad JSON, unclosed block, missing name, arguments that are not
  an object, stray text between parts) is left in the content verbatim and counted as a
  parse failure, so the trajectory keeps the signal. Parsers never raise on any input.
- Text that merely spells a markup string (ordinary tokens, not the markup token) is text.

Formats wrapped in ``<tool_call>...</tool_call>`` blocks (this module):
- ``hermes`` (Qwen2.5, Qwen3): ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``;
  ``arguments`` may also be a JSON string holding an object, or absent (empty object).
- ``qwen3_coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>`` (``<function=``/``<parameter=`` are text, not tokens). One newline
  after the opening and before the closing parameter tag belongs to the markup.
- ``glm45`` (GLM-4.5/4.6): ``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE</arg_value>\\n
  ...</tool_call>``; the template writes string values raw and others as JSON.
For qwen3_coder and glm45 a VALUE is parsed as JSON when it parses, else kept as a string;
when ``tool_specs`` declare the parameter's type as ``string`` it is always kept as a string.
Other formats: ``_deepseek`` (deepseek_v31), ``_llama`` (llama3_json), ``_harmony`` (gpt-oss).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from proxy.chat import ToolSpec
from proxy.parsers._pieces import Markup, Piece, is_blank, is_tag, text_of

OPEN, CLOSE = "<tool_call>", "</tool_call>"
Call = tuple[str, dict[str, Any]]


@dataclass
class ExtractedCalls:
    """Text outside well-formed calls, the calls as (name, arguments), the failure count, and
    (for formats that carry it in their own markup, e.g. harmony channels) the reasoning."""

    content: str
    calls: list[Call] = field(default_factory=list)
    failures: int = 0
    reasoning: str | None = None


class ToolParser(Protocol):
    # The markup strings this format uses (the decoder recognises them; see _pieces).
    markup: ClassVar[frozenset[str]]

    def extract(
        self, pieces: Sequence[Piece], tool_specs: list[ToolSpec] | None = None
    ) -> ExtractedCalls: ...


class _BlockToolParser:
    """Shared scan over ``<tool_call>`` blocks; subclasses decode one block body."""

    markup: ClassVar[frozenset[str]] = frozenset({OPEN, CLOSE})

    def decode(self, body: list[Piece], tool_specs: list[ToolSpec] | None) -> Call | None:
        raise NotImplementedError

    def extract(self, pieces: Sequence[Piece], tool_specs: list[ToolSpec] | None = None) -> ExtractedCalls:
        out = ExtractedCalls(content="")
        text: list[Piece] = []
        i, n = 0, len(pieces)
        while i < n:
            if not is_tag(pieces[i], OPEN):
                text.append(pieces[i])
                i += 1
                continue
            end = next((j for j in range(i + 1, n) if is_tag(pieces[j], CLOSE)), None)
            if end is None:  # unclosed (e.g. truncated): the rest stays as text
                text.extend(pieces[i:])
                out.failures += 1
                break
            call = self.decode(list(pieces[i + 1 : end]), tool_specs)
            if call is None:
                text.extend(pieces[i : end + 1])
                out.failures += 1
            else:
                out.calls.append(call)
            i = end + 1
        out.content = text_of(text)
        return out


def loads(raw: str) -> Any:
    """``json.loads`` that raises only ``ValueError`` (deep nesting must not escape)."""
    try:
        return json.loads(raw)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply") from e


def json_call(obj: Any) -> Call | None:
    """A decoded ``{"name": N, "arguments"|"parameters": {...}}`` as a call, or None. The
    arguments may be a JSON string holding an object; absent, they are ``{}``."""
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = loads(args)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return name, args


class HermesToolParser(_BlockToolParser):
    def decode(self, body: list[Piece], tool_specs: list[ToolSpec] | None) -> Call | None:
        try:
            return json_call(loads(text_of(body)))
        except ValueError:
            return None


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def string_params(tool_specs: list[ToolSpec] | None, name: str) -> set[str]:
    """The parameters of tool ``name`` that its JSON schema declares as strings."""
    for spec in tool_specs or ():
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        if isinstance(fn, dict) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"}
    return set()


def json_or_str(raw: str) -> Any:
    try:
        return loads(raw)
    except ValueError:
        return raw


class Qwen3CoderToolParser(_BlockToolParser):
    def decode(self, body: list[Piece], tool_specs: list[ToolSpec] | None) -> Call | None:
        match = _FUNCTION.fullmatch(text_of(body))
        if match is None:
            return None
        name, inner = match.group(1).strip(), match.group(2)
        if not name:
            return None
        as_string = string_params(tool_specs, name)
        args: dict[str, Any] = {}
        pos = 0
        for param in _PARAM.finditer(inner):
            if inner[pos : param.start()].strip():  # stray text between parameters
                return None
            key, raw = param.group(1).strip(), param.group(2)
            raw = raw.removeprefix("\n").removesuffix("\n")
            args[key] = raw if key in as_string else json_or_str(raw)
            pos = param.end()
        if inner[pos:].strip():  # unclosed parameter or junk after the last one
            return None
        return name, args


KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


class Glm45ToolParser(_BlockToolParser):
    markup: ClassVar[frozenset[str]] = _BlockToolParser.markup | {
        KEY_OPEN,
        KEY_CLOSE,
        VALUE_OPEN,
        VALUE_CLOSE,
    }

    def decode(self, body: list[Piece], tool_specs: list[ToolSpec] | None) -> Call | None:
        first_key = next((i for i, p in enumerate(body) if is_tag(p, KEY_OPEN)), len(body))
        head = body[:first_key]
        if any(isinstance(p, Markup) for p in head):
            return None
        name = text_of(head).strip()
        if not name or "\n" in name:
            return None
        as_string = string_params(tool_specs, name)
        args: dict[str, Any] = {}
        rest = body[first_key:]
        while rest:
            if is_blank(rest[0]):  # the template's newline between pairs
                rest = rest[1:]
                continue
            pair = _key_value(rest)
            if pair is None:
                return None
            key, raw, rest = pair
            args[key] = raw if key in as_string else json_or_str(raw.strip())
        return name, args


def _key_value(p: list[Piece]) -> tuple[str, str, list[Piece]] | None:
    """``<arg_key>K</arg_key> <arg_value>V</arg_value>`` at the start of ``p`` -> (K, V, rest)."""
    if not is_tag(p[0], KEY_OPEN):
        return None
    key_end = next((i for i, x in enumerate(p) if is_tag(x, KEY_CLOSE)), None)
    if key_end is None or any(isinstance(x, Markup) for x in p[1:key_end]):
        return None
    key = text_of(p[1:key_end]).strip()
    i = key_end + 1
    while i < len(p) and is_blank(p[i]):
        i += 1
    if not key or i >= len(p) or not is_tag(p[i], VALUE_OPEN):
        return None
    value_end = next((j for j in range(i + 1, len(p)) if is_tag(p[j], VALUE_CLOSE)), None)
    if value_end is None:
        return None
    return key, text_of(p[i + 1 : value_end]), p[value_end + 1 :]
