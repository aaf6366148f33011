"""``llama3_json``: Llama-3.1/3.2/3.3 JSON tool calls.

The model answers a tool turn with JSON instead of prose, with or without the
``<|python_tag|>`` token in front:

    <|python_tag|>{"name": NAME, "parameters": {...}}            (or "arguments")
    {"name": A, "parameters": {...}}; {"name": B, "parameters": {...}}   (parallel: ``;``)

- After ``<|python_tag|>`` the rest of the output must be calls: JSON objects separated by
  ``;``, or a built-in tool call ``brave_search.call(query="...")`` (keyword arguments with
  literal values; becomes a call of ``brave_search``). Text before the tag is content.
  Anything else after the tag is a parse failure (all of it stays in the content).
- Without the tag, output that starts (after whitespace) with ``{`` is calls when the whole
  of it parses as calls. When it does not, it is a failure if it starts like a call
  (``{"name":``), else ordinary content (a JSON answer).
- ``parameters``/``arguments`` may be an object or a JSON string holding one; absent: ``{}``.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from proxy.chat import ToolSpec
from proxy.parsers._pieces import Piece, is_tag, text_of
from proxy.parsers._tools import Call, ExtractedCalls, json_call

PYTHON_TAG = "<|python_tag|>"
_LOOKS_LIKE_CALL = re.compile(r'\s*\{\s*"name"\s*:')
_DECODER = json.JSONDecoder()


class Llama3JsonToolParser:
    markup: ClassVar[frozenset[str]] = frozenset({PYTHON_TAG})

    def extract(self, pieces: Sequence[Piece], tool_specs: list[ToolSpec] | None = None) -> ExtractedCalls:
        tag = next((i for i, p in enumerate(pieces) if is_tag(p, PYTHON_TAG)), None)
        if tag is not None:
            before, body = text_of(pieces[:tag]), text_of(pieces[tag + 1 :])
            calls = _json_calls(body)
            if calls is None:
                calls = _builtin_call(body)
            if calls is None:
                return ExtractedCalls(content=text_of(pieces), failures=1)
            return ExtractedCalls(content=before, calls=calls)
        text = text_of(pieces)
        if not text.lstrip().startswith("{"):
            return ExtractedCalls(content=text)
        calls = _json_calls(text)
        if calls is not None:
            return ExtractedCalls(content="", calls=calls)
        return ExtractedCalls(content=text, failures=1 if _LOOKS_LIKE_CALL.match(text) else 0)


def _json_calls(text: str) -> list[Call] | None:
    """``;``-separated call objects making up all of ``text``, or None."""
    calls: list[Call] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        try:
            obj, pos = _DECODER.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return None
        call = json_call(obj)
        if call is None:
            return None
        calls.append(call)
        while pos < n and text[pos].isspace():
            pos += 1
        if pos == n:
            return calls
        if text[pos] != ";":
            return None
        pos += 1


def _builtin_call(text: str) -> list[Call] | None:
    """``tool.call(key=literal, ...)`` (Llama's built-in tools), or None."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    node = tree.body
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and isinstance(node.func.value, ast.Name)
        and not node.args
        and all(k.arg for k in node.keywords)
    ):
        return None
    args: dict[str, Any] = {}
    for k in node.keywords:
        try:
            args[str(k.arg)] = ast.literal_eval(k.value)
        except (ValueError, SyntaxError, RecursionError):
            return None
    return [(node.func.value.id, args)]
