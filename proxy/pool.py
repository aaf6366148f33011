"""ReplicaPool: which vLLM replica generates a turn, and what happens when one fails.

Policy (the one place retries live):
- A session sticks to the replica that served it last while that replica is up, so its
  growing prompt keeps hitting the same prefix cache.
- A new session (or one whose replica went down) goes to the up replica with the fewest
  in-flight requests; ties go to the earliest added.
- A turn that fails with ``ReplicaUnavailable`` or a 5xx ``BackendHTTPError`` is
  replayed on another replica (the proxy holds the prompt tokens, so a turn is
  replayable); replicas marked down are tried last, since health marks can be stale.
  Each replica is tried at most once per attempt; when none answers the pool raises
  ``ReplicaUnavailable`` naming every failure. Non-retryable errors propagate at once.
- A generation the backend aborts (finish_reason "abort", e.g. during a weight sync) is
  resumed: prompt + tokens so far are re-sent with the remaining ``max_tokens`` and the
  pieces are stitched into ONE ``Generation`` (``resumed_after_abort`` counts resumes).
  After ``max_resumes`` resumes the pool gives up with ``GenerationAborted``.
- A background task polls ``GET /health`` every ``health_interval_s`` (None: no polling;
  failures and successes of real calls still update the marks).
- Replicas can be added and removed at runtime; a removed replica finishes its
  in-flight calls, and sessions stuck to it move on their next turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from proxy.backend import CompletionRequest, VLLMClient, is_retryable
from proxy.chat import Generation
from proxy.errors import BackendError, GenerationAborted, ReplicaUnavailable
from proxy.trajectory import id_array

log = logging.getLogger(__name__)


@dataclass
class Replica:
    """State of one replica as the pool sees it."""

    url: str
    client: VLLMClient
    up: bool = True
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    order: int = 0
    max_model_len: int | None = None


@dataclass
class _Stitch:
    """Accumulates the pieces of one generation across aborts."""

    prompt_ids: Sequence[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    experts: np.ndarray | None = None
    experts_broken: bool = False
    resumes: int = 0

    def add(self, piece: Generation) -> None:
        """Append one piece. Experts: a piece covers positions [0, prompt + generated - 1);
        the positions the earlier pieces already routed are kept (that is the routing used
        when those tokens were sampled), the rest come from the new piece. A piece with
        tokens but without experts, after pieces with them, drops experts for the whole
        generation rather than storing a misaligned array."""
        if piece.routed_experts is not None and not self.experts_broken:
            if self.experts is None:
                self.experts = piece.routed_experts
            else:
                self.experts = np.concatenate([self.experts, piece.routed_experts[len(self.experts) :]])
        elif piece.token_ids and self.experts is not None:
            log.warning("routed_experts missing on a resumed piece; dropping experts for this generation")
            self.experts, self.experts_broken = None, True
        self.token_ids += piece.token_ids
        self.logprobs += piece.logprobs

    def result(self, last: Generation) -> Generation:
        return replace(
            last,
            prompt_token_ids=self.prompt_ids,
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            routed_experts=self.experts,
            resumed_after_abort=self.resumes,
        )


class ReplicaPool:
    """Routes generations over vLLM replicas. Use ``async with`` or ``start()``/``close()``.

    ``client_factory`` builds the per-replica client (tests pass one with short timeouts).
    """

    def __init__(
        self,
        urls: Iterable[str] = (),
        *,
        client_factory: Callable[[str], VLLMClient] = VLLMClient,
        health_interval_s: float | None = 5.0,
        max_resumes: int = 8,
    ) -> None:
        self._factory = client_factory
        self._replicas: dict[str, Replica] = {}
        self._sticky: dict[str, str] = {}
        self._health_interval_s = health_interval_s
        self._health_task: asyncio.Task[None] | None = None
        self._added = 0
        self._retired: list[Replica] = []
        self.max_resumes = max_resumes
        for url in urls:
            self.add_replica(url)

    # -- membership ---------------------------------------------------------------------
    def add_replica(self, url: str) -> None:
        """Add ``url`` (idempotent). It starts marked up."""
        url = url.rstrip("/")
        if url not in self._replicas:
            self._replicas[url] = Replica(url, self._factory(url), order=self._added)
            self._added += 1

    def remove_replica(self, url: str) -> None:
        """Stop routing new work to ``url`` (unknown urls are ignored). Its in-flight calls
        finish; its client is closed after the last of them, or at ``close()``."""
        rep = self._replicas.pop(url.rstrip("/"), None)
        if rep is not None:
            self._retired.append(rep)

    @property
    def replicas(self) -> list[Replica]:
        return sorted(self._replicas.values(), key=lambda r: r.order)

    def forget(self, session_key: str) -> None:
        """Drop a closed session's stickiness."""
        self._sticky.pop(session_key, None)

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        if self._health_interval_s is not None and self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop())

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None
        for rep in [*self._replicas.values(), *self._retired]:
            await rep.client.close()
        self._retired.clear()

    async def __aenter__(self) -> ReplicaPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def check_health(self) -> None:
        """Probe every replica once and update its mark."""
        reps = list(self._replicas.values())
        results = await asyncio.gather(*(r.client.healthy() for r in reps))
        for rep, ok in zip(reps, results):
            if rep.up != ok:
                log.info("replica %s is now %s", rep.url, "up" if ok else "down")
            rep.up = ok

    async def context_limit(self) -> int | None:
        """The smallest ``max_model_len`` over the replicas (asked once per replica, on first
        use); None when no replica reports one."""
        missing = [r for r in self._replicas.values() if r.max_model_len is None]
        for rep, n in zip(missing, await asyncio.gather(*(r.client.max_model_len() for r in missing))):
            rep.max_model_len = n
        known = [r.max_model_len for r in self._replicas.values() if r.max_model_len is not None]
        return min(known) if known else None

    async def _health_loop(self) -> None:
        assert self._health_interval_s is not None
        while True:
            await asyncio.sleep(self._health_interval_s)
            await self.check_health()

    # -- routing --------------------------------------------------------------------------
    def _candidates(self, session_key: str) -> list[Replica]:
        """Sticky replica first (if up), then up replicas by load, then down ones."""
        reps = self.replicas
        up = sorted((r for r in reps if r.up), key=lambda r: (r.in_flight, r.order))
        down = [r for r in reps if not r.up]
        sticky = self._replicas.get(self._sticky.get(session_key, ""))
        if sticky is not None and sticky.up:
            up.remove(sticky)
            up.insert(0, sticky)
        return up + down

    async def _generate_once(self, session_key: str, req: CompletionRequest) -> Generation:
        """One call with failover across replicas (no abort handling)."""
        errors: list[str] = []
        candidates = self._candidates(session_key)
        if not candidates:
            raise ReplicaUnavailable("no replicas configured")
        for rep in candidates:
            rep.in_flight += 1
            try:
                gen = await rep.client.complete(req)
            except BackendError as exc:
                if not is_retryable(exc):
                    raise
                rep.failures += 1
                if isinstance(exc, ReplicaUnavailable):
                    rep.up = False
                errors.append(str(exc))
                continue
            finally:
                rep.in_flight -= 1
                if rep in self._retired and rep.in_flight == 0:
                    self._retired.remove(rep)
                    await rep.client.close()
            rep.up, rep.served = True, rep.served + 1
            if rep.url in self._replicas:
                self._sticky[session_key] = rep.url
            return gen
        raise ReplicaUnavailable("no replica answered: " + "; ".join(errors))

    async def generate(self, session_key: str, req: CompletionRequest) -> Generation:
        """Generate for ``session_key``, failing over and resuming aborts (module docstring)."""
        stitch = _Stitch(prompt_ids=req.prompt_ids)
        piece_req = req
        while True:
            piece = await self._generate_once(session_key, piece_req)
            stitch.add(piece)
            remaining = req.max_tokens - len(stitch.token_ids)
            if piece.finish_reason == "abort" and remaining <= 0:
                # Every requested token arrived before the abort: that is a length stop.
                return replace(stitch.result(piece), finish_reason="length")
            if piece.finish_reason != "abort":
                return stitch.result(piece)
            if stitch.resumes >= self.max_resumes:
                raise GenerationAborted(
                    f"generation aborted {stitch.resumes + 1} times; giving up", replica=piece.replica
                )
            stitch.resumes += 1
            log.info(
                "generation aborted on %s after %d tokens; resuming", piece.replica, len(stitch.token_ids)
            )
            piece_req = replace(
                req, prompt_ids=id_array(stitch.prompt_ids) + id_array(stitch.token_ids), max_tokens=remaining
            )
