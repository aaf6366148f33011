"""Typed errors of the proxy. Each protocol module renders them in its own wire shape.

Error tree (HTTP status in brackets; Anthropic renders 529 where OpenAI renders 503)::

    ProxyError
    ├── ProtocolError [4xx]            the client's request cannot be served as sent
    │   ├── InvalidRequest [400]       malformed body, wrong types, unsupported content (images)
    │   │   ├── ContextExhausted [400] prompt (+ max_tokens) does not fit the context window
    │   │   ├── TurnLimitReached [400] the session's turn limit (``SessionConfig.max_turns``) is spent
    │   │   ├── BudgetSpent [400]      the trial's token budget ended its agent turns (``overlong_ends_session``)
    │   │   └── ReplayDiverged [400]   a record-only replay got a request its record cannot answer
    │   ├── NotFound [404]             unknown session, secret or route
    │   ├── RequestTimeout [408]       the body did not arrive within the server's read timeout
    │   ├── PayloadTooLarge [413]      body over the server's size limit
    │   └── TooManyRequests [429]      the session's requests in flight (count or body bytes) at their limit
    └── BackendError [5xx]             the replicas failed; the request itself was fine
        ├── ReplicaUnreachable [503]   a replica did not answer (refused, reset, timed out, hung);
        │                              from the pool: none did, every retry spent
        ├── BackendHTTPError [502]     a replica answered with an unexpected HTTP status
        └── GenerationAborted [503]    a generation was aborted and could not be resumed

``ProtocolError`` subclasses carry a neutral ``error_type`` (``invalid_request``,
``not_found``, ``request_too_large``, ``context_exhausted``, ``turn_limit_reached``,
``budget_spent``, ``rate_limited``) that the
protocol modules map to their own type names. ``BackendError`` is retryable from the
client's point of view: both official SDKs retry 409 and 5xx/529 answers on their own.

``ReplicaUnreachable`` was called ``ReplicaUnavailable``; that name still imports from here,
with a ``DeprecationWarning``. It is not the pipeline's ``trialflow.errors.ReplicaUnavailable``
(a trial attempt whose agent failed while its model pool was down: a Temporal error type).

This module is pure: no I/O, no framework imports.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

ErrorType = Literal[
    "invalid_request",
    "not_found",
    "request_too_large",
    "context_exhausted",
    "turn_limit_reached",
    "budget_spent",
    "rate_limited",
]


class ProxyError(Exception):
    """Base of every error the proxy answers with. ``status`` is the HTTP status to send."""

    status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProtocolError(ProxyError):
    """A 4xx answer. ``param`` names the offending request field when one is known."""

    def __init__(
        self,
        status: int,
        message: str,
        error_type: ErrorType = "invalid_request",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type: ErrorType = error_type
        self.param = param


class InvalidRequest(ProtocolError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(400, message, "invalid_request", param)


class ContextExhausted(InvalidRequest):
    """The prompt leaves no room to generate.

    The message follows the upstream APIs' wording ("prompt is too long: N tokens > M
    maximum") because agent scaffolds match on it to trigger conversation compaction.
    """

    def __init__(self, prompt_tokens: int, max_context_tokens: int) -> None:
        super().__init__(f"prompt is too long: {prompt_tokens} tokens > {max_context_tokens} maximum")
        self.error_type = "context_exhausted"
        self.prompt_tokens = prompt_tokens
        self.max_context_tokens = max_context_tokens


class TurnLimitReached(InvalidRequest):
    """The session already served its ``max_turns`` agent turns; this request is refused and
    nothing is generated or recorded for it.

    A 400, which no client retries: it is how a CLI without a hard turn limit of its own
    (Codex, OpenCode) is stopped at the limit. The wording avoids what clients match as an
    exhausted context ("too long", "context length", "exceeds the limit"), which would make
    them compact and try again instead of stopping."""

    def __init__(self, max_turns: int) -> None:
        super().__init__(
            f"turn limit reached: this session serves at most {max_turns} agent turn"
            + ("" if max_turns == 1 else "s")
        )
        self.error_type = "turn_limit_reached"
        self.max_turns = max_turns


class BudgetSpent(InvalidRequest):
    """The session's sequence reached the trial's token budget at an earlier turn (a turn refused
    as too long, or cut at the budget), and the session ends the agent's turns there
    (``SessionConfig.overlong_ends_session``): nothing the agent does after the trained sequence
    ends may change the outcome it is graded on. A 400, which no client retries; the wording
    avoids what clients match as an exhausted context (see ``TurnLimitReached``), so the agent
    stops instead of compacting and trying again."""

    def __init__(self, max_tokens: int | None) -> None:
        budget = f"{max_tokens}-token budget" if max_tokens is not None else "token budget"
        super().__init__(
            f"token budget spent: this session's sequence already used its {budget}; "
            "no further agent turns are served"
        )
        self.error_type = "budget_spent"
        self.max_tokens = max_tokens


class ReplayDiverged(InvalidRequest):
    """A session replaying a record without replicas (``trialflow replay --from-record``) got
    a request that differs from the record, or one past its end. A 400, so SDKs do not retry
    it: the scaffold stops, and the replay reports where it left the record."""

    def __init__(self, message: str) -> None:
        super().__init__(f"replay diverged from the record: {message}")


class NotFound(ProtocolError):
    def __init__(self, message: str) -> None:
        super().__init__(404, message, "not_found")


class RequestTimeout(ProtocolError):
    def __init__(self, seconds: float) -> None:
        super().__init__(408, f"request body not received within {seconds:g} s", "invalid_request")


class PayloadTooLarge(ProtocolError):
    """``size`` None: a chunked body, cut off once it passed ``limit`` (its size is unknown)."""

    def __init__(self, size: int | None, limit: int) -> None:
        what = f"request body of {size} bytes" if size is not None else "request body"
        super().__init__(413, f"{what} exceeds the limit of {limit} bytes", "request_too_large")
        self.size = size
        self.limit = limit


class TooManyRequests(ProtocolError):
    """A session's listener limits (`proxy.limits.RequestGate`): the request is refused
    before its body is read. Both official SDKs retry a 429 with backoff."""

    def __init__(self, message: str) -> None:
        super().__init__(429, message, "rate_limited")


class BackendError(ProxyError):
    """The replicas could not produce the turn. ``replica`` is the URL involved, if any."""

    status = 502

    def __init__(self, message: str, replica: str = "") -> None:
        super().__init__(message)
        self.replica = replica


class ReplicaUnreachable(BackendError):
    """A generation call got no answer from its replica (connection refused or reset, the
    server gone, a timeout or a hung replica's deadline); raised by the pool once no replica
    answered. OpenAI answers carry the class name as ``code``."""

    status = 503


class BackendHTTPError(BackendError):
    """A replica answered ``upstream_status``; ``body`` is the start of its answer, for logs."""

    status = 502

    def __init__(self, upstream_status: int, body: str, replica: str = "") -> None:
        super().__init__(f"replica {replica or '?'} answered HTTP {upstream_status}: {body[:500]}", replica)
        self.upstream_status = upstream_status
        self.body = body


class GenerationAborted(BackendError):
    status = 503


_RENAMED = {"ReplicaUnavailable": "ReplicaUnreachable"}


def __getattr__(name: str) -> Any:
    """Old names of renamed errors, with a ``DeprecationWarning``."""
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"proxy.errors.{name} is now {new}", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
