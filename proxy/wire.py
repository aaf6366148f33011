"""Helpers shared by the protocol adapters (``anthropic_api``, ``openai_api``). Pure.

- ``WireModel``: pydantic base of every wire model: strict types (``"5"`` is not an int,
  ``true`` is not a number), no NaN/inf, unknown fields kept in ``model_extra`` so the
  adapters can report them as ignored instead of rejecting them.
- ``validate(model, data, path)``: the only place a wire model is built; any failure becomes
  ``InvalidRequest`` (400) whose message names each offending field as a path such as
  ``messages[2].content[0].text``.
- ``generic(path)``: ``messages[3].content[1].x`` -> ``messages[].content[].x``, the form
  used in ``ChatRequest.ignored_fields`` so the list stays short.
- ``pieces(s, size)``: split text for streaming deltas.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from proxy.errors import InvalidRequest


class WireModel(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


W = TypeVar("W", bound=WireModel)


def validate(model: type[W], data: Any, path: str = "") -> W:
    """Build ``model`` from ``data`` (a decoded JSON value) found at ``path`` ("" = the body)."""
    if not isinstance(data, dict):
        raise InvalidRequest(f"{path or 'request body'}: expected a JSON object, got {json_type(data)}", param=path or None)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise InvalidRequest(_describe(e, path), param=_loc(path, e.errors()[0]["loc"])) from None


def note_unused(block: WireModel, path: str, unused_known: set[str], ignored: set[str]) -> None:
    """Add to ``ignored`` the unknown fields of ``block`` and the known ones it sent but the proxy ignores."""
    unused = set(block.model_extra or ()) | (unused_known & block.model_fields_set)
    ignored |= {f"{generic(path)}.{k}" if path else k for k in unused}


def _describe(e: ValidationError, path: str) -> str:
    """One clause per offending field; the alternatives of a union are merged with "or"."""
    by_field: dict[str, list[str]] = {}
    for err in e.errors():
        msgs = by_field.setdefault(_loc(path, err["loc"]) or "request body", [])
        if err["msg"] not in msgs:
            msgs.append(err["msg"])
    clauses = [f"{where}: {' or '.join(msgs)}" for where, msgs in by_field.items()]
    return "; ".join(clauses[:3]) + (f" (and {len(clauses) - 3} more)" if len(clauses) > 3 else "")


# pydantic puts the member of a union into ``loc`` ("str", "list[dict[str,any]]", "TextBlock", ...)
_UNION_TAG = re.compile(r"^(str|int|float|bool|none|literal\[.*\]|list\[.*\]|dict\[.*\]|[A-Z]\w*)$")


def _loc(path: str, loc: tuple[Any, ...]) -> str:
    out = path
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _UNION_TAG.match(str(part)):
            out += f".{part}" if out else str(part)
    return out


def generic(path: str) -> str:
    return re.sub(r"\[\d+\]", "[]", path)


def json_type(v: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if v is None else names.get(type(v), type(v).__name__)


def pieces(s: str, size: int) -> list[str]:
    """``s`` in consecutive pieces of at most ``size`` characters ([] for "")."""
    size = max(size, 1)
    return [s[i : i + size] for i in range(0, len(s), size)]
