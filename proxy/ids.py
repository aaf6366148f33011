"""Ids the proxy invents for its answers, derived from (seed, turn) instead of drawn at random (pure).

A replayed attempt must hand its scaffold byte-identical answers, and a turn generated live
after a replay must look like the same turn of an uninterrupted run (a chat template may
render tool-call ids into later prompts). So every id the proxy makes up is a function of
the session's ``id_seed`` (``SessionConfig.id_seed``: the trial id for trial sessions, so all
attempts of a trial share it; the session id otherwise), the turn index and the id's place
in the turn. Shapes are the vendors' own: Anthropic ``msg_``/``toolu_`` + 24 hex, OpenAI
``chatcmpl-`` + 32 hex and ``call_`` + 24 hex, Responses ``resp_`` + 32 hex, its output items
``{rs,msg,fc,ctc}_`` + 32 hex (derived from the response id and the item's place).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from proxy.chat import Protocol

# (response id prefix, hex digits), (tool-call id prefix, hex digits) per protocol
_SHAPES: dict[str, tuple[tuple[str, int], tuple[str, int]]] = {
    "anthropic": (("msg_", 24), ("toolu_", 24)),
    "openai": (("chatcmpl-", 32), ("call_", 24)),
    "openai_responses": (("resp_", 32), ("call_", 24)),
}


def _hex(seed: str, turn: int, what: str, digits: int) -> str:
    data = f"{seed}\x00{turn}\x00{what}".encode()
    return hashlib.blake2b(data, digest_size=(digits + 1) // 2).hexdigest()[:digits]


def response_id(protocol: Protocol, seed: str, turn: int) -> str:
    """The message / completion id of turn ``turn``."""
    prefix, digits = _SHAPES[protocol][0]
    return prefix + _hex(seed, turn, "response", digits)


def tool_call_ids(protocol: Protocol, seed: str, turn: int) -> Callable[[], str]:
    """A factory of turn ``turn``'s tool-call ids, in call order (the parsers call it once per call)."""
    prefix, digits = _SHAPES[protocol][1]
    n = 0

    def next_id() -> str:
        nonlocal n
        n += 1
        return prefix + _hex(seed, turn, f"tool{n - 1}", digits)

    return next_id


def item_id(prefix: str, response_id: str, n: int) -> str:
    """Output item ``n`` of a Responses answer (``rs``, ``msg``, ``fc``, ``ctc`` items)."""
    return f"{prefix}_" + _hex(response_id, n, prefix, 32)
