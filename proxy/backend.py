"""vLLM ``POST /v1/completions`` client, token-in/token-out.

The proxy owns the tokens: it sends the prompt as a list of ids and reads back the
sampled ids, their logprobs and (for MoE models) the routed experts, so nothing is
re-tokenized. Request body (vLLM 0.32 field names)::

    {"model", "prompt": [ids], "max_tokens", "temperature", "top_p", "top_k"?, "seed"?,
     "stop"?, "logprobs": 1, "return_token_ids": true, "skip_special_tokens": false,
     "include_stop_str_in_output": true, "stream": false}

Response fields read: ``choices[0].token_ids``, ``choices[0].prompt_token_ids`` (falls
back to a top-level ``prompt_token_ids``), ``choices[0].logprobs.token_logprobs``,
``choices[0].finish_reason`` and ``choices[0].routed_experts`` (base64 of an
``np.save`` array of shape [prompt + generated - 1, layers, top_k], or null for dense
models / R3 off).

Errors (see ``proxy.errors``):
- connection refused/reset, server disconnect, timeout -> ``ReplicaUnreachable``
- HTTP 5xx -> ``BackendHTTPError`` (``is_retryable(exc)`` is True: another replica may answer)
- HTTP 4xx -> ``BackendHTTPError`` carrying vLLM's message (not retryable: the same body
  would fail everywhere)
- a 200 whose body breaks the contract (missing ids, echoed prompt differs from the one
  sent, logprob count mismatch) -> ``BackendProtocolError`` (a ``BackendError``; not
  retryable: a replica that garbles tokens must not silently corrupt a trajectory).

This client makes no retries of its own; the retry policy lives in ``proxy.pool``.
"""

from __future__ import annotations

import base64
import io
import json
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from proxy import jsonio
from proxy.chat import FinishReason, Generation, SamplingParams
from proxy.errors import BackendError, BackendHTTPError, ReplicaUnreachable
from proxy.http1 import Http1Error, Http1Pool
from proxy.trajectory import IDS_CODE, same_ids


class BackendProtocolError(BackendError):
    """A replica answered 200 with a body that breaks the completions contract."""


def is_retryable(exc: BackendError) -> bool:
    """Whether another replica might succeed where this error happened."""
    if isinstance(exc, ReplicaUnreachable):
        return True
    return isinstance(exc, BackendHTTPError) and exc.upstream_status >= 500


_JSON_HEADERS = {"Content-Type": "application/json"}
# A health probe's verdict (VLLMClient.probe).
Health = Literal["up", "down", "silent"]

_FINISH_REASONS: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass(frozen=True)
class CompletionRequest:
    """One token-in generation call. ``max_tokens`` is already clamped to the context.
    ``prompt_ids``: a list or an int32 ``array`` (the tracker's prompts are arrays)."""

    model: str
    prompt_ids: Sequence[int]
    max_tokens: int
    sampling: SamplingParams = SamplingParams()


def build_body(req: CompletionRequest, prompt_json: bytes | None = None) -> dict[str, Any]:
    """The JSON body for ``/v1/completions``. ``top_k <= 0`` and ``seed=None`` are omitted
    (vLLM's own defaults then apply: no top-k, random seed). ``prompt_json``: the prompt ids
    already encoded (``encode_prompt``), embedded as they are."""
    s = req.sampling
    body: dict[str, Any] = {
        "model": req.model,
        "prompt": _json_ids(req.prompt_ids) if prompt_json is None else jsonio.RawJSON(prompt_json),
        "max_tokens": req.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "logprobs": 1,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "include_stop_str_in_output": True,
        "stream": False,
    }
    if s.top_k > 0:
        body["top_k"] = s.top_k
    if s.seed is not None:
        body["seed"] = s.seed
    if s.stop:
        body["stop"] = list(s.stop)
    return body


def encode_prompt(ids: Sequence[int]) -> bytes:
    """The prompt ids as compact JSON bytes (what ``build_body`` sends for them)."""
    return jsonio.dumps(_json_ids(ids))


def _json_ids(ids: Sequence[int]) -> Any:
    """Token ids in a form ``jsonio.dumps`` encodes as a JSON array: an int32 ``array`` as a
    numpy view of its buffer (orjson writes it in C, without an int object per id)."""
    if isinstance(ids, array) and ids.typecode == IDS_CODE:
        return np.frombuffer(ids, dtype=np.int32) if ids else []
    return list(ids)


def decode_routed_experts(encoded: str) -> np.ndarray:
    """Decode vLLM's base64 ``np.save`` payload to an integer array [n, layers, top_k].

    Raises ``BackendProtocolError`` for anything that is not a 3-d integer array; pickled
    object arrays are refused (``allow_pickle=False``).
    """
    try:
        arr = np.load(io.BytesIO(base64.b64decode(encoded, validate=True)), allow_pickle=False)
    except (ValueError, OSError, TypeError) as exc:
        raise BackendProtocolError(f"undecodable routed_experts: {exc}") from exc
    if arr.ndim != 3 or not np.issubdtype(arr.dtype, np.integer):
        raise BackendProtocolError(f"routed_experts must be a 3-d integer array, got {arr.dtype}{arr.shape}")
    return arr


def encode_routed_experts(arr: np.ndarray) -> str:
    """Inverse of ``decode_routed_experts`` (vLLM's wire encoding)."""
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def drop_verified_echo(raw: bytes, prompt_json: bytes) -> tuple[bytes, bool]:
    """``raw`` with its echoed prompt replaced by null, and True, when the echo is byte for
    byte the prompt as sent (``prompt_json``, compact JSON); else ``raw`` unchanged and False.

    Why: at 47K prompt tokens, decoding the echo (one int object per id) and comparing it cost
    ~4 ms per turn. vLLM writes compact JSON, so its echo of the prompt is usually the very
    bytes we sent, and finding them is one ``bytes.find``. The match is exact: the key can only
    be a key (an unescaped quote cannot occur inside a JSON string) and the closing bracket
    is part of the searched bytes. Anything else (spaces, a different prompt) goes the slow
    way: parsed and compared id by id in ``parse_completion``.
    """
    marker = b'"prompt_token_ids":' + prompt_json
    at = raw.find(marker)
    if at < 0:
        return raw, False
    return raw[:at] + b'"prompt_token_ids":null' + raw[at + len(marker) :], True


def parse_completion(
    payload: Any, req: CompletionRequest, replica: str = "", echo_verified: bool = False
) -> Generation:
    """Turn a ``/v1/completions`` JSON body into a ``Generation`` for ``req``.

    Edge cases: an empty ``token_ids`` is valid (e.g. an abort before the first token);
    ``finish_reason`` null or unknown is a protocol error, as is an echoed prompt that
    differs from the prompt sent. ``echo_verified``: the echo was already checked (and
    removed) by ``drop_verified_echo``.
    """
    try:
        choice = payload["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        prompt_ids = choice.get("prompt_token_ids") or payload.get("prompt_token_ids")
        raw_reason = choice.get("finish_reason")
        lp = choice.get("logprobs") or {}
        token_logprobs = lp.get("token_logprobs") if token_ids else []
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BackendProtocolError(f"malformed completion response: {exc!r}") from exc
    if prompt_ids is not None and not echo_verified and not same_ids(prompt_ids, req.prompt_ids):
        raise BackendProtocolError(
            f"backend echoed a different prompt ({len(prompt_ids)} ids) than sent ({len(req.prompt_ids)} ids)"
        )
    if raw_reason not in _FINISH_REASONS:
        raise BackendProtocolError(f"unexpected finish_reason {raw_reason!r}")
    if token_logprobs is None or len(token_logprobs) != len(token_ids) or None in token_logprobs:
        raise BackendProtocolError("logprobs missing or not one per generated token")
    experts = choice.get("routed_experts")
    return Generation(
        prompt_token_ids=req.prompt_ids,
        token_ids=token_ids,
        logprobs=[float(v) for v in token_logprobs],
        finish_reason=_FINISH_REASONS[raw_reason],
        routed_experts=decode_routed_experts(experts) if experts else None,
        replica=replica,
    )


def _error_message(body: str) -> str:
    """vLLM answers errors as ``{"error": {"message": ...}}`` (older: ``{"message": ...}``)."""
    try:
        data = json.loads(body)
    except ValueError:
        return body[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
    return body[:500]


class VLLMClient:
    """Client for one vLLM replica at ``url`` (``http://host:port``, no ``/v1``).

    ``timeout_s`` bounds a whole generation call; None means unbounded. ``on_response``
    sees every 200 body as decoded JSON before parsing (tracing; tests compare it with
    the trajectory). The aiohttp
    session is created lazily in the running loop and closed by ``close()``.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float | None = 600.0,
        connect_timeout_s: float = 5.0,
        on_response: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._on_response = on_response
        self._timeout_s, self._connect_timeout_s = timeout_s, connect_timeout_s
        # how each answer's echoed prompt was checked (see drop_verified_echo)
        self.echo_checks = {"bytes": 0, "parsed": 0}
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._http: aiohttp.ClientSession | None = None
        # generation calls (one per turn) go through the lean keep-alive client; https and
        # the rare GETs use aiohttp
        parts = urlsplit(self.url)
        self._fast = (
            Http1Pool(parts.hostname, parts.port or 80) if parts.scheme == "http" and parts.hostname else None
        )

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        return self._http

    async def close(self) -> None:
        if self._fast is not None:
            await self._fast.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def complete(self, req: CompletionRequest) -> Generation:
        """One generation. Raises ``ReplicaUnreachable`` / ``BackendHTTPError`` /
        ``BackendProtocolError`` as described in the module docstring."""
        prompt_json = encode_prompt(req.prompt_ids)  # once: the body's prompt and the echo check
        body = jsonio.dumps(build_body(req, prompt_json))
        try:
            if self._fast is not None:
                status, raw = await self._fast.post(
                    "/v1/completions",
                    body,
                    timeout_s=self._timeout_s,
                    connect_timeout_s=self._connect_timeout_s,
                )
            else:
                async with self._session().post(
                    f"{self.url}/v1/completions", data=body, headers=_JSON_HEADERS
                ) as resp:
                    raw = await resp.read()
                    status = resp.status
        except (TimeoutError, Http1Error, aiohttp.ClientConnectionError) as exc:
            raise ReplicaUnreachable(f"{self.url}: {type(exc).__name__}: {exc}", replica=self.url) from exc
        if status >= 400:
            raise BackendHTTPError(status, _error_message(raw.decode(errors="replace")), replica=self.url)
        # a tracing hook sees vLLM's whole answer, so only untraced calls take the shortcut
        echo_verified = False
        if self._on_response is None:
            raw, echo_verified = drop_verified_echo(raw, prompt_json)
        self.echo_checks["bytes" if echo_verified else "parsed"] += 1
        try:
            payload = jsonio.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BackendProtocolError(f"{self.url}: response is not JSON", replica=self.url) from exc
        if self._on_response is not None:
            self._on_response(payload)
        try:
            return parse_completion(payload, req, replica=self.url, echo_verified=echo_verified)
        except BackendProtocolError as exc:
            raise BackendProtocolError(f"{self.url}: {exc}", replica=self.url) from None

    async def max_model_len(self, timeout_s: float = 5.0) -> int | None:
        """The served model's ``max_model_len`` from ``GET /v1/models``; None if the replica
        does not answer or does not report it. Never raises."""
        try:
            async with self._session().get(
                f"{self.url}/v1/models", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                data = await resp.json() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        try:
            value = data["data"][0]["max_model_len"]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            return None
        return value if isinstance(value, int) and value > 0 else None

    async def metrics_text(self, timeout_s: float = 5.0) -> str | None:
        """``GET /metrics`` (vLLM's Prometheus text); None without a 200 answer within
        ``timeout_s``. Never raises."""
        try:
            async with self._session().get(
                f"{self.url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return await resp.text() if resp.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
            return None

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        """True when ``GET /health`` answers 200 within ``timeout_s``; never raises."""
        return await self.probe(timeout_s) == "up"

    async def probe(self, timeout_s: float = 5.0) -> Health:
        """``GET /health``: "up" (200), "down" (another status, or the connection refused or
        dropped: nothing serves there) or "silent" (no answer within ``timeout_s``: hung, or
        too busy to answer, e.g. its server stalled by a long prefill). Never raises."""
        try:
            async with self._session().get(
                f"{self.url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                return "up" if resp.status == 200 else "down"
        except TimeoutError:
            return "silent"
        except aiohttp.ClientError:
            return "down"
