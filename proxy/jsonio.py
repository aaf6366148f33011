"""JSON on the proxy's hot path: orjson (Rust) with the stdlib as the fallback. Pure.

Every turn decodes the client's whole history and the backend's reply (thousands of token
ids) and encodes the prompt ids and the answer; with the stdlib that was about 0.9 ms of the
proxy's ~5 ms per turn. orjson does the same in a tenth of the time.

Behaviour is the stdlib's where orjson is stricter:
- ``loads`` falls back to ``json.loads`` for what orjson refuses but the stdlib accepts
  (integers beyond 64 bits, ``NaN``/``Infinity`` literals), so such bodies fail or pass the
  same way as before (the wire models reject NaN themselves); strings with lone surrogates
  stay refused (``ValueError``). Invalid JSON raises
  ``ValueError`` (``json.JSONDecodeError``) either way; invalid UTF-8 raises ``ValueError``
  or ``UnicodeDecodeError``.
- ``dumps`` falls back to ``json.dumps`` for what orjson cannot encode (integers beyond
  64 bits, non-string dict keys), e.g. tool-call arguments the model wrote. Output is
  compact UTF-8 (no ASCII escaping) either way. NaN/infinity encode as ``null`` (orjson);
  nothing the proxy sends carries them.

Nesting: values nested deeper than ``MAX_DEPTH`` (254, orjson's encoder limit) raise
``TooDeep`` (a ``ValueError``): from ``loads`` for what no parser here takes (orjson stops at
1024 levels; the stdlib fallback would overflow the Python stack), from ``dumps`` and
``json_digest`` for anything deeper than ``MAX_DEPTH``. The proxy encodes every history
message and tool list (their content keys) and renders them through the chat template, so
a deeper request cannot be served: it is the client's 400, never a RecursionError. A deep
value in a field the proxy ignores is not walked (that would cost every turn): up to 1024
levels it is ignored like the field itself.

Content keys (one definition for the proxy's caches): ``digest(text_or_bytes)`` is a 16-byte
BLAKE2b (collisions: ~2^-64); ``json_digest(value)`` is the digest of ``dumps(value)``, or
None for a value that is not plain JSON. Keying on JSON text, not Python equality, keeps
``true``, ``1`` and ``1.0`` apart (a chat template renders them differently).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

MAX_DEPTH = 254


class TooDeep(ValueError):
    """A JSON value nested deeper than the proxy handles (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__(f"JSON nested deeper than {MAX_DEPTH} levels")


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise TooDeep() from None
        try:
            value = json.loads(data)
        except RecursionError:
            raise TooDeep() from None
    # The stdlib also accepts "\ud800"-style lone surrogates, which orjson (rightly) refuses:
    # no UTF-8 text holds them, so the tokenizer and every encoder downstream would fail on
    # them mid-turn. Refuse them here, where it is the client's malformed JSON.
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("JSON string holds a lone surrogate (not valid Unicode text)") from None
    return value


def loads_shallow(data: bytes | str) -> Any:
    """``loads``, also refusing (``TooDeep``) a value deeper than ``MAX_DEPTH``. For JSON inside
    a string (tool-call arguments): the content keys see such a string as a leaf, so nothing
    else would check the value before the chat template renders it."""
    value = loads(data)
    dumps(value)
    return value


class RawJSON:
    """Already-encoded JSON that ``dumps`` embeds as is (a prompt encoded once per turn is
    both the request's ``prompt`` and the bytes its echo is checked against)."""

    __slots__ = ("data", "_fragment")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._fragment = orjson.Fragment(data)


def dumps(obj: Any) -> bytes:
    """Numpy arrays inside ``obj`` encode as JSON arrays (token ids sent as array views);
    ``RawJSON`` values are embedded without re-encoding."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY, default=_fragment)
    except (orjson.JSONEncodeError, TypeError) as exc:
        if "Recursion limit" in str(exc):
            raise TooDeep() from None
        try:
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=_plain).encode()
        except RecursionError:
            raise TooDeep() from None


def _fragment(obj: Any) -> Any:
    if isinstance(obj, RawJSON):
        return obj._fragment
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _plain(obj: Any) -> Any:
    """The stdlib fallback's view of numpy values and ``RawJSON`` (orjson takes them natively)."""
    if isinstance(obj, RawJSON):
        return json.loads(obj.data)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def digest(data: bytes | str) -> bytes:
    """16-byte BLAKE2b of ``data`` (a ``str`` as UTF-8, lone surrogates kept)."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=16).digest()


def json_digest(value: Any) -> bytes | None:
    """``digest(dumps(value))``, or None when ``value`` is not plain JSON. ``TooDeep`` for a
    value nested deeper than ``MAX_DEPTH``."""
    try:
        return digest(dumps(value))
    except TooDeep:
        raise
    except (TypeError, ValueError):
        return None
