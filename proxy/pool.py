"""ReplicaPool: which vLLM replica generates a turn, and what happens when one fails.

Policy (the one place retries live):
- A session sticks to the replica that served it last while that replica is up, so its
  growing prompt keeps hitting the same prefix cache.
- A new session (or one whose replica went down) goes to the up replica with the fewest
  in-flight requests, then the fewest sessions stuck to it now, then the fewest sessions
  ever stuck to it, then the earliest added. The last two matter when trials trickle in one
  at a time: every replica is idle then, and "earliest added" alone would send every
  session to the first replica.
- A turn that fails with ``ReplicaUnreachable`` or a 5xx ``BackendHTTPError`` is
  replayed on another replica (the proxy holds the prompt tokens, so a turn is
  replayable); replicas marked down are tried last, since health marks can be stale.
  Each replica is tried at most once per attempt; when none answers the pool raises
  ``ReplicaUnreachable`` naming every failure. Non-retryable errors propagate at once.
- A generation the backend aborts (finish_reason "abort", e.g. during a weight sync) is
  resumed: prompt + tokens so far are re-sent with the remaining ``max_tokens`` and the
  pieces are stitched into ONE ``Generation`` (``resumed_after_abort`` counts resumes).
  After ``max_resumes`` resumes the pool gives up with ``GenerationAborted``.
- A background task polls ``GET /health`` every ``health_interval_s`` (None: no polling;
  failures and successes of real calls still update the marks). A replica with calls in
  flight whose probe gets no answer ("silent", not refused) is busy, not down: a long prefill
  can stall its HTTP server. It keeps its mark for up to ``busy_grace_s`` of silent probes
  (its calls' deadlines judge it meanwhile); a refused connection or an error status marks
  it down at once, and a replica with nothing in flight is marked down on its first silence.
- While no replica can serve a turn (every one failed it: down, refused, 5xx, deadline; or
  none configured), the turn is HELD, not failed: it waits for a replica to be marked up
  (the health loop's probe, a replica added; without a health loop it probes every
  ``outage_retry_s`` itself) and is tried again, at most every ``outage_retry_s``, for up to
  ``outage_hold_s`` (default 300 s, below the 600 s read timeout of the official SDKs and
  Claude Code, so a non-streaming client is still waiting; streaming clients get the
  server's keep-alive pings meanwhile). Only past that bound does it fail with
  ``ReplicaUnreachable``; ``outage_hold_s`` 0 fails at once. ``on_hold`` (an argument of
  ``generate``) is called when a turn starts to be held. The first ``max_model_len`` is
  waited for the same way (``context_limit(hold=True)``).
- A hung replica (a stopped process, a wedged GPU) answers neither the turn nor the health
  probe. Each generation attempt therefore has a deadline (``Deadlines``: a grace period
  plus ``max_tokens`` over the replica's observed tokens per second, times a slack) and is
  also watched for its replica being marked down: either one cancels the call, marks the
  replica down and replays the turn on another replica. The cancelled call's partial output
  was never seen (calls are non-streaming), so the replayed turn's record is exact.
- Replicas can be added and removed at runtime; a removed replica finishes its
  in-flight calls, and sessions stuck to it move on their next turn.

Load: each health round also reads every up replica's own ``/metrics`` (``scrape_load``:
KV-cache usage, waiting requests, preemptions; proxy.replica_load) into ``Replica.load``.
vLLM counts every client's requests there, so a pool sees the replica's global state, not
just its own sessions' (admission reads it: trialflow.admission). A replica that does not
answer, or answers with text that is not vLLM's, keeps no load (unknown, not idle).

Sharing: a worker serves many sessions from one pool per replica set (``SharedPools``):
load, stickiness and health marks are then seen by every session on that set, and the
health loop and ``/v1/models`` questions run once per set, not once per session.

Replica URLs are ``http(s)://host[:port]`` with a port in 1..65535 (``replica_url``
normalises them and raises ``ValueError`` for anything else).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from proxy.backend import CompletionRequest, VLLMClient, is_retryable
from proxy.chat import Generation
from proxy.errors import BackendError, GenerationAborted, ReplicaUnreachable
from proxy.replica_load import ReplicaLoad, parse_vllm_metrics
from proxy.trajectory import id_array

log = logging.getLogger(__name__)


def replica_url(url: object) -> str:
    """``url`` normalised (no trailing slash); ``ValueError`` unless it is
    ``http(s)://host[:port]`` with no path or query and a port in 1..65535."""
    if not isinstance(url, str):
        raise ValueError(f"replica url must be a string, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError for a port out of 0..65535 or not a number
    except ValueError as exc:
        raise ValueError(f"{url!r} is not an http(s)://host[:port] url: {exc}") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.path.strip("/")
        or parts.query
        or parts.fragment
        or port == 0
    ):
        raise ValueError(f"{url!r} is not an http(s)://host[:port] url")
    return url.rstrip("/")


@dataclass(frozen=True)
class Deadlines:
    """How long one generation attempt may run on a replica before it is cancelled and
    replayed elsewhere: ``grace_s + slack * max_tokens / tokens_per_s``, where
    ``tokens_per_s`` is the replica's observed rate (an average over its recent calls:
    generated tokens over the call's wall time, so prefill and queueing count against it).
    Before a replica has finished a call it is ``max_s``; the result is never above
    ``max_s``. ``grace_s`` covers prefill and queueing that the rate does not foresee."""

    grace_s: float = 30.0
    slack: float = 3.0
    max_s: float = 600.0

    def deadline_s(self, max_tokens: int, tokens_per_s: float | None) -> float:
        if not tokens_per_s or tokens_per_s <= 0:
            return self.max_s
        return min(self.max_s, self.grace_s + self.slack * max_tokens / tokens_per_s)


# weight of the newest call in a replica's tokens-per-second average
_RATE_WEIGHT = 0.3
# How long a turn waits for a replica while none can serve it (module docstring).
DEFAULT_OUTAGE_HOLD_S = 300.0


@dataclass
class Replica:
    """State of one replica as the pool sees it. ``down`` is set while it is marked down
    (generations running on it watch it)."""

    url: str
    client: VLLMClient
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    order: int = 0
    max_model_len: int | None = None
    sessions: int = 0  # sessions stuck to this replica now
    assigned: int = 0  # sessions ever stuck to it (round-robin among otherwise equal replicas)
    tokens_per_s: float | None = None  # observed generation rate (see Deadlines)
    down: asyncio.Event = field(default_factory=asyncio.Event)
    silent_since: float | None = None  # first of the current run of unanswered probes (monotonic)
    load: ReplicaLoad | None = None  # from its /metrics at the last health round (module docstring)

    @property
    def up(self) -> bool:
        return not self.down.is_set()

    @up.setter
    def up(self, value: bool) -> None:
        if value:
            self.down.clear()
        else:
            self.down.set()

    def observe(self, tokens: int, seconds: float) -> None:
        """Fold one finished call into ``tokens_per_s`` (calls without tokens say nothing)."""
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        old = self.tokens_per_s
        self.tokens_per_s = rate if old is None else (1 - _RATE_WEIGHT) * old + _RATE_WEIGHT * rate


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
    ``health_timeout_s`` bounds one health probe (a hung replica is marked down after it).
    ``deadlines``: per-attempt generation deadlines (module docstring).
    ``outage_hold_s`` / ``outage_retry_s``: how long a turn no replica can serve is held, and
    how often it looks again; ``busy_grace_s``: how long a replica with calls in flight may
    leave probes unanswered before it is marked down (module docstring).
    """

    def __init__(
        self,
        urls: Iterable[str] = (),
        *,
        client_factory: Callable[[str], VLLMClient] = VLLMClient,
        health_interval_s: float | None = 5.0,
        health_timeout_s: float = 5.0,
        max_resumes: int = 8,
        deadlines: Deadlines = Deadlines(),
        outage_hold_s: float = DEFAULT_OUTAGE_HOLD_S,
        outage_retry_s: float = 1.0,
        busy_grace_s: float = 60.0,
    ) -> None:
        if outage_hold_s < 0 or outage_retry_s <= 0 or busy_grace_s < 0:
            raise ValueError("outage_hold_s and busy_grace_s must be >= 0, outage_retry_s > 0")
        self.outage_hold_s, self.outage_retry_s, self.busy_grace_s = (
            outage_hold_s,
            outage_retry_s,
            busy_grace_s,
        )
        # set (and replaced) whenever a replica may have become able to serve: held turns wake
        self._came_up = asyncio.Event()
        self._factory = client_factory
        self._health_timeout_s = health_timeout_s
        self.deadlines = deadlines
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
        """Add ``url`` (idempotent). It starts marked up. ``ValueError`` for a bad url."""
        url = replica_url(url)
        if url not in self._replicas:
            self._replicas[url] = Replica(url, self._factory(url), order=self._added)
            self._added += 1
            self._wake_held()

    def _wake_held(self) -> None:
        """Wake the turns held for an outage (a replica came up or was added)."""
        event, self._came_up = self._came_up, asyncio.Event()
        event.set()

    def remove_replica(self, url: str) -> None:
        """Stop routing new work to ``url`` (unknown urls are ignored). Its in-flight calls
        finish; its client is closed after the last of them, or at ``close()``."""
        rep = self._replicas.pop(url.rstrip("/"), None)
        if rep is not None:
            self._retired.append(rep)
            for key in [k for k, u in self._sticky.items() if u == rep.url]:
                del self._sticky[key]

    @property
    def replicas(self) -> list[Replica]:
        return sorted(self._replicas.values(), key=lambda r: r.order)

    def forget(self, session_key: str) -> None:
        """Drop a closed session's stickiness."""
        self._stick(session_key, None)

    def sticky_replica(self, session_key: str) -> str | None:
        """The replica ``session_key`` sticks to (None before its first turn)."""
        return self._sticky.get(session_key)

    def _stick(self, session_key: str, url: str | None) -> None:
        old = self._sticky.pop(session_key, None)
        if old is not None and old in self._replicas:
            self._replicas[old].sessions -= 1
        if url is not None and url in self._replicas:
            self._sticky[session_key] = url
            self._replicas[url].sessions += 1
            self._replicas[url].assigned += 1

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        self.start_health_loop()

    def start_health_loop(self) -> None:
        """Start polling health (needs a running loop; a no-op when running or disabled)."""
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
        """Probe every replica once and update its mark (a busy replica's silence is
        forgiven for ``busy_grace_s``: module docstring)."""
        reps = list(self._replicas.values())
        results = await asyncio.gather(*(r.client.probe(self._health_timeout_s) for r in reps))
        now = time.monotonic()
        came_up = False
        for rep, state in zip(reps, results, strict=True):
            ok = state == "up"
            if state == "silent" and rep.up and rep.in_flight > 0:
                if rep.silent_since is None:
                    rep.silent_since = now
                if now - rep.silent_since < self.busy_grace_s:
                    log.debug(
                        "replica %s: no health answer with %d calls in flight: busy", rep.url, rep.in_flight
                    )
                    continue
            rep.silent_since = now if state == "silent" else None
            if rep.up != ok:
                log.info("replica %s is now %s (health: %s)", rep.url, "up" if ok else "down", state)
                came_up |= ok
            rep.up = ok
        if came_up:
            self._wake_held()

    async def context_limit(self, *, hold: bool = False) -> int | None:
        """The smallest ``max_model_len`` over the replicas (asked once per replica, on first
        use); None when no replica reports one. ``hold``: while none does, wait for a replica
        as a held turn does (up to ``outage_hold_s``), then None."""
        deadline = time.monotonic() + self.outage_hold_s
        while True:
            missing = [r for r in self._replicas.values() if r.max_model_len is None]
            for rep, n in zip(
                missing, await asyncio.gather(*(r.client.max_model_len() for r in missing)), strict=True
            ):
                rep.max_model_len = n
            known = [r.max_model_len for r in self._replicas.values() if r.max_model_len is not None]
            if (
                known
                or not hold
                or time.monotonic() >= deadline
                or not await self._wait_for_replica(deadline)
            ):
                return min(known) if known else None

    async def _wait_for_replica(self, deadline: float) -> bool:
        """Wait ``outage_retry_s`` (less at the deadline), then until some replica is marked up
        (probing itself when no health loop runs); False once ``deadline`` (monotonic) passed
        with none up."""
        await asyncio.sleep(max(0.0, min(self.outage_retry_s, deadline - time.monotonic())))
        while True:
            if self._health_task is None:
                await self.check_health()
            if any(r.up for r in self._replicas.values()):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._came_up.wait(), min(left, self.outage_retry_s))

    async def _health_loop(self) -> None:
        assert self._health_interval_s is not None
        while True:
            await asyncio.sleep(self._health_interval_s)
            await self.check_health()
            await self.scrape_load()

    async def scrape_load(self) -> None:
        """Read every up replica's ``/metrics`` into its ``load`` (module docstring)."""
        reps = [r for r in self._replicas.values() if r.up]
        texts = await asyncio.gather(*(r.client.metrics_text(self._health_timeout_s) for r in reps))
        for rep, text in zip(reps, texts, strict=True):
            try:
                rep.load = parse_vllm_metrics(text) if text is not None else None
            except ValueError as exc:
                log.debug("replica %s: no load from /metrics: %s", rep.url, exc)
                rep.load = None

    # -- routing --------------------------------------------------------------------------
    def _candidates(self, session_key: str) -> list[Replica]:
        """Sticky replica first (if up), then up replicas by load, then down ones."""
        reps = self.replicas
        up = sorted((r for r in reps if r.up), key=lambda r: (r.in_flight, r.sessions, r.assigned, r.order))
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
            raise ReplicaUnreachable("no replicas configured")
        for rep in candidates:
            rep.in_flight += 1
            started = time.monotonic()
            try:
                gen = await self._attempt(rep, req)
            except BackendError as exc:
                if not is_retryable(exc):
                    raise
                rep.failures += 1
                if isinstance(exc, ReplicaUnreachable):
                    rep.up = False
                errors.append(str(exc))
                continue
            finally:
                rep.in_flight -= 1
                if rep in self._retired and rep.in_flight == 0:
                    self._retired.remove(rep)
                    await rep.client.close()
            rep.up, rep.served = True, rep.served + 1
            rep.observe(len(gen.token_ids), time.monotonic() - started)
            if self._sticky.get(session_key) != rep.url:
                self._stick(session_key, rep.url)
            return gen
        raise ReplicaUnreachable("no replica answered: " + "; ".join(errors))

    async def _attempt(self, rep: Replica, req: CompletionRequest) -> Generation:
        """One call on ``rep``, cancelled at its deadline or when ``rep`` is marked down
        (only a change to down while it runs counts: a replica tried although already
        marked down, as a last resort, is bounded by the deadline alone)."""
        deadline = self.deadlines.deadline_s(req.max_tokens, rep.tokens_per_s)
        call = asyncio.ensure_future(rep.client.complete(req))
        watched: set[asyncio.Future[Any]] = {call}
        marked_down = asyncio.ensure_future(rep.down.wait()) if rep.up else None
        if marked_down is not None:
            watched.add(marked_down)
        try:
            await asyncio.wait(watched, timeout=deadline, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if marked_down is not None:
                marked_down.cancel()
            if not call.done():
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
        if not call.cancelled():
            return call.result()
        if marked_down is not None and rep.down.is_set():
            why = "was marked down while generating"
        else:
            rep.up = False
            why = f"gave no answer within its {deadline:.1f} s deadline ({req.max_tokens} max tokens)"
        log.warning("replica %s %s; the turn moves to another replica", rep.url, why)
        raise ReplicaUnreachable(f"{rep.url} {why}", replica=rep.url)

    async def _generate_held(
        self, session_key: str, req: CompletionRequest, on_hold: Callable[[], None] | None
    ) -> Generation:
        """``_generate_once``, held while no replica can serve it (module docstring)."""
        deadline: float | None = None
        while True:
            try:
                return await self._generate_once(session_key, req)
            except ReplicaUnreachable as exc:
                if self.outage_hold_s <= 0:
                    raise
                if deadline is None:
                    deadline = time.monotonic() + self.outage_hold_s
                    log.warning(
                        "session %s: no replica can serve its turn (%s); holding it for up to %g s",
                        session_key,
                        exc,
                        self.outage_hold_s,
                    )
                    if on_hold is not None:
                        on_hold()
                if time.monotonic() >= deadline or not await self._wait_for_replica(deadline):
                    raise ReplicaUnreachable(
                        f"no replica could serve the turn within {self.outage_hold_s:g} s: {exc}",
                        replica=exc.replica,
                    ) from None

    async def generate(
        self, session_key: str, req: CompletionRequest, *, on_hold: Callable[[], None] | None = None
    ) -> Generation:
        """Generate for ``session_key``, failing over, holding the turn through an outage and
        resuming aborts (module docstring)."""
        stitch = _Stitch(prompt_ids=req.prompt_ids)
        piece_req = req
        while True:
            piece = await self._generate_held(session_key, piece_req, on_hold)
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


@dataclass
class _SharedPool:
    pool: ReplicaPool
    refs: int = 0
    closing: asyncio.TimerHandle | None = None


class SharedPools:
    """One started ``ReplicaPool`` per replica set, shared by the sessions that name that set.

    ``acquire(urls)`` returns the set's pool (building and starting it on first use) and
    counts a reference; ``release(pool)`` drops one. A pool nobody uses is closed
    ``linger_s`` later (0: at once), so trials that follow one another on the same replicas
    keep its health marks, load counts and context limit instead of starting cold.
    The set is compared after normalisation and regardless of order, so two trials handed
    the same rollout servers by verl share one pool: its least-loaded choice and health
    marks cover all of their sessions. ``factory`` builds a pool for a tuple of urls.
    """

    def __init__(
        self, factory: Callable[[Sequence[str]], ReplicaPool] = ReplicaPool, *, linger_s: float = 30.0
    ) -> None:
        self._factory = factory
        self._linger_s = linger_s
        self._pools: dict[frozenset[str], _SharedPool] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def acquire(self, urls: Iterable[str]) -> ReplicaPool:
        """The shared pool for ``urls`` (``ValueError`` for a bad url or an empty set).
        Needs a running event loop (the pool's health loop starts here)."""
        normal = tuple(dict.fromkeys(replica_url(u) for u in urls))
        if not normal:
            raise ValueError("a replica set needs at least one url")
        key = frozenset(normal)
        entry = self._pools.get(key)
        if entry is None:
            entry = self._pools[key] = _SharedPool(self._factory(normal))
            entry.pool.start_health_loop()
        if entry.closing is not None:
            entry.closing.cancel()
            entry.closing = None
        entry.refs += 1
        return entry.pool

    async def release(self, pool: ReplicaPool) -> None:
        """Drop one reference to ``pool``; unknown pools are ignored."""
        for key, entry in self._pools.items():
            if entry.pool is pool:
                entry.refs -= 1
                if entry.refs <= 0:
                    if self._linger_s <= 0:
                        await self._close(key, entry)
                    else:
                        entry.closing = asyncio.get_running_loop().call_later(
                            self._linger_s, self._close_later, key, entry
                        )
                return

    def _close_later(self, key: frozenset[str], entry: _SharedPool) -> None:
        task = asyncio.ensure_future(self._close(key, entry))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close(self, key: frozenset[str], entry: _SharedPool) -> None:
        if self._pools.get(key) is entry and entry.refs <= 0:
            del self._pools[key]
            await entry.pool.close()

    def pools(self) -> list[tuple[ReplicaPool, int]]:
        """(pool, sessions using it) for each live replica set (lingering ones with 0)."""
        return [(e.pool, e.refs) for e in self._pools.values()]

    async def close(self) -> None:
        entries, self._pools = list(self._pools.values()), {}
        for entry in entries:
            if entry.closing is not None:
                entry.closing.cancel()
            await entry.pool.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
