"""Tool-call parsers: pull well-formed tool-call blocks out of generated text.

Both formats wrap each call in ``<tool_call>...</tool_call>``. A block that is malformed
(bad JSON, unclosed tag, missing name, arguments that are not an object) is left in the
content verbatim and counted as a parse failure, so the trajectory keeps the signal.
Parsers never raise on any input text.

- ``hermes``: ``<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>``; ``arguments``
  may also be a JSON string holding an object, or absent (empty object).
- ``qwen3_coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n
  </function>\\n</tool_call>``. One newline after the opening and before the closing parameter
  tag belongs to the markup. A VALUE is parsed as JSON when it parses, else kept as a string;
  when ``tool_specs`` declare the parameter's type as ``string`` it is always kept as a string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.chat import ToolSpec

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class ExtractedCalls:
    """Text outside well-formed blocks, the calls as (name, arguments), and failure count."""

    content: str
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    failures: int = 0


class ToolParser(Protocol):
    def extract(self, text: str, tool_specs: list[ToolSpec] | None = None) -> ExtractedCalls: ...


class _BlockToolParser:
    """Shared scan over ``<tool_call>`` blocks; subclasses decode one block body."""

    def decode(self, body: str, tool_specs: list[ToolSpec] | None) -> tuple[str, dict[str, Any]] | None:
        raise NotImplementedError

    def extract(self, text: str, tool_specs: list[ToolSpec] | None = None) -> ExtractedCalls:
        out = ExtractedCalls(content="")
        pieces: list[str] = []
        pos = 0
        while (start := text.find(OPEN, pos)) != -1:
            pieces.append(text[pos:start])
            end = text.find(CLOSE, start + len(OPEN))
            if end == -1:  # unclosed (e.g. truncated): the rest stays as text
                pieces.append(text[start:])
                out.failures += 1
                pos = len(text)
                break
            call = self.decode(text[start + len(OPEN) : end], tool_specs)
            if call is None:
                pieces.append(text[start : end + len(CLOSE)])
                out.failures += 1
            else:
                out.calls.append(call)
            pos = end + len(CLOSE)
        pieces.append(text[pos:])
        out.content = "".join(pieces)
        return out


class HermesToolParser(_BlockToolParser):
    def decode(self, body: str, tool_specs: list[ToolSpec] | None) -> tuple[str, dict[str, Any]] | None:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):  # deep nesting must not escape
            return None
        if not isinstance(obj, dict):
            return None
        name = obj.get("name")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):  # deep nesting must not escape
                return None
        if not isinstance(name, str) or not name or not isinstance(args, dict):
            return None
        return name, args


_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


def _string_params(tool_specs: list[ToolSpec] | None, name: str) -> set[str]:
    for spec in tool_specs or ():
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        if isinstance(fn, dict) and fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k for k, v in props.items() if isinstance(v, dict) and v.get("type") == "string"}
    return set()


class Qwen3CoderToolParser(_BlockToolParser):
    def decode(self, body: str, tool_specs: list[ToolSpec] | None) -> tuple[str, dict[str, Any]] | None:
        match = _FUNCTION.fullmatch(body)
        if match is None:
            return None
        name, inner = match.group(1).strip(), match.group(2)
        if not name:
            return None
        as_string = _string_params(tool_specs, name)
        args: dict[str, Any] = {}
        pos = 0
        for param in _PARAM.finditer(inner):
            if inner[pos : param.start()].strip():  # stray text between parameters
                return None
            key, raw = param.group(1).strip(), param.group(2)
            raw = raw.removeprefix("\n")
            raw = raw.removesuffix("\n")
            args[key] = raw if key in as_string else _json_or_str(raw)
            pos = param.end()
        if inner[pos:].strip():  # unclosed parameter or junk after the last one
            return None
        return name, args


def _json_or_str(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # deep nesting must not escape
        return raw
