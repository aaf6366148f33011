"""aiohttp app of the proxy: management API + Anthropic / OpenAI Chat Completions / Responses routes.

Management: a listener of its own, apart from the protocol routes (a Unix socket
``management_socket``, else a second TCP port on ``host``, ``management_url``), where every
request carries ``Authorization: Bearer <management_token>`` (401 otherwise; the token is
generated when not given: ``ProxyServer.management_token``). ``GET /sessions/{id}`` and
``POST /sessions/{id}/close`` also need that session's secret in the header
``X-Trialflow-Session-Secret`` (404 otherwise, as for an unknown session). The worker uses
the same operations in-process and sandboxes reach neither listener (docs/design.md,
"Sandbox network")::

    POST /sessions               {model?, sampling?: {...}, max_context_tokens?, max_response_tokens?,
                                  overlong_ends_session?, infra_ends_session?, replicas?: [url],
                                  metadata?: {...}, reasoning_parser?, tool_parser?, id_seed?}
                                 (the fields of proxy.session.SessionConfig.with_overrides)
                                 -> {session_id, secret, anthropic_base_url, openai_base_url}
    GET  /sessions/{id}          -> live stats
    POST /sessions/{id}/close    -> trajectory npz bytes (``?format=json``: JSON summary)
    POST /policy_version         {version: int} -> {version, sessions}: a weight sync; every open
                                 session records the new weights version (a turn running across
                                 the change records both ends in its segment's range)
    GET  /replicas               -> {replicas: [{url, up, in_flight, served, failures, sessions,
                                 tokens_per_s, max_model_len}], shared: [{sessions, replicas: [...]}]}
                                 (the server's default pool; the shared pools of sessions that
                                 name their own replicas)
    POST /replicas               {add?: [url], remove?: [url]} -> the same listing: replicas joining
                                 or leaving (elastic rollout servers). Adding a known url and
                                 removing an unknown one are no-ops; a removed replica finishes its
                                 in-flight turns, and sessions stuck to it move on their next turn.
                                 Urls must be http(s)://host[:port] (400 otherwise; nothing changes).

Protocol routes, under ``/s/{id}/{secret}/v1/``: ``messages`` (``?beta=true`` accepted),
``messages/count_tokens``, ``chat/completions``, ``responses`` (OpenAI Responses API),
``models``. The secret (``secrets.
token_urlsafe``) is compared in constant time; a wrong secret, unknown or closed session is a
404 in the protocol's error shape, so one session can never reach another's data.
``models`` and unknown routes answer in the Anthropic shape when the request carries an
``anthropic-version`` header, else in the OpenAI shape.

Bodies over ``max_body_bytes`` (8 MiB by default; with a Content-Length or chunked) -> 413
in the protocol's error shape. Real scaffold bodies are far smaller: Claude Code sends about
1 MB at 160K prompt tokens (~6.5 bytes a token), so 8 MiB holds a 1M-token context at that
density with room to spare; what is larger cannot fit any context the replicas serve, and
costs seconds of CPU per MiB to render and encode (docs/benchmarks.md, "Large bodies"). A
body of ``large_body_bytes`` (256 KiB) or more is decoded, parsed and its turn prepared
(render + encode) in a worker thread, at most two such requests at once, so the event loop
keeps answering the other sessions meanwhile: the tokenizer runs there with the interpreter
lock released, and long prompts are encoded in bounded pieces (proxy.prefix_cache). A body
that has
not arrived within ``body_timeout_s`` -> 408; values nested deeper than the encoders take
(``jsonio.TooDeep``) -> 400; bodies that are not JSON -> 400; anything the
adapters reject -> their 4xx. An unexpected exception is logged and answered 500 (never
expected; tests assert it does not happen).

Limits per session (``proxy.limits``): at most ``session_max_requests`` requests in flight
and ``session_max_queued_bytes`` of their bodies, taken before a body is read (else 429 in
the protocol's shape, which the SDKs retry; a refused large body is left unread, its
connection's reading paused until the lingering close); a session-bound listener holds at most
``session_max_connections`` connections (else 503 and closed). So one sandbox flooding its
listener costs the proxy neither memory nor the worker's file descriptors, and the other
sessions' turns go on.

Streaming: each turn is generated with one non-streaming backend call. The response
waits up to ``keepalive_s`` for the turn before committing to a 200 event stream, so errors
that come quickly (context exhausted, bad request) keep their HTTP status. After that it
sends ``ping`` events (Anthropic) / SSE comment lines (OpenAI) every ``keepalive_s`` until
the turn finishes, then the result's events; a failure after the stream started is sent
as the protocol's error event. The turn runs as its own task, so a client that
disconnects does not cancel it: its tokens are still recorded.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import secrets
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from proxy import anthropic_api, jsonio, openai_api, responses_api
from proxy.chat import ChatRequest, TurnOutcome
from proxy.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ProxyError,
    RequestTimeout,
    TooManyRequests,
)
from proxy.limits import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_REQUESTS,
    RequestGate,
    capped,
)
from proxy.parsers import REASONING_PARSERS, TOOL_PARSERS, check_parsers
from proxy.pool import ReplicaPool, SharedPools, replica_url
from proxy.prefix_cache import PrefixCache
from proxy.profiles import ModelProfile, UnsupportedTemplate, detect_profile, load_generation_eos
from proxy.replica_load import ReplicaLoad
from proxy.session import Session, SessionConfig, SessionStats
from proxy.token_bound import TokenBound
from proxy.trajectory import Trajectory

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 8 * 1024**2
# Bodies from this size on are handled off the event loop (module docstring).
DEFAULT_LARGE_BODY_BYTES = 256 * 1024
# Large requests handled at once: each keeps a core busy for seconds; more only add memory.
_LARGE_BODY_WORKERS = 2
# How long stop() (and a session's listener at close) waits for handlers still running after
# the sessions are closed: by then a turn's answer is written, and what is left is aiohttp
# lingering over a body it refused unread (a 413/408 waits up to 10 s for the rest of the
# body), which would otherwise hold stop() for aiohttp's default 60 s shutdown timeout.
_SHUTDOWN_TIMEOUT_S = 1.0

T = TypeVar("T")


@dataclass(frozen=True)
class SessionHandle:
    """What a scaffold needs to reach its session."""

    session_id: str
    secret: str
    anthropic_base_url: str
    openai_base_url: str


@dataclass
class _Entry:
    session: Session
    secret: str
    shared_pool: ReplicaPool | None  # the shared pool of this session's own replica list
    gate: RequestGate = field(default_factory=RequestGate)  # requests in flight (proxy.limits)
    listeners: list[tuple[asyncio.Server, web.AppRunner]] = field(default_factory=list)  # `serve_session`


# On a session-bound app (`serve_session`): the (session id, secret) every request is for.
_BOUND = web.AppKey("bound_session", tuple)


ManagementHandler = Callable[[Any, web.Request], Awaitable[web.Response]]


def _management(handler: ManagementHandler) -> ManagementHandler:
    """A management handler whose ``ProxyError`` is answered as ``{"error": {type, message}}``
    with the error's status (the protocol routes answer in their protocol's own shape)."""

    @functools.wraps(handler)
    async def answer(self: Any, request: web.Request) -> web.Response:
        try:
            return await handler(self, request)
        except ProxyError as exc:
            return _mgmt_error(exc)

    return answer


def _check_parsers(profile: ModelProfile, defaults: SessionConfig) -> None:
    """A default of ``"auto"`` must resolve to a registered parser (else: start-up error)."""
    for name, default, registry in (
        (profile.reasoning_parser, defaults.reasoning_parser, REASONING_PARSERS),
        (profile.tool_parser, defaults.tool_parser, TOOL_PARSERS),
    ):
        if default == "auto" and name is not None and name not in registry:
            raise UnsupportedTemplate(
                f"model family {profile.family!r} needs {registry.kind} {name!r}, which is not registered "
                f"(available: {', '.join(registry.names())}); set it in the session defaults or the profile"
            )


class ProxyServer:
    """One proxy per worker process. ``start()``/``stop()`` for in-process use, ``serve()``
    to run standalone until cancelled.

    ``pool`` (or ``replicas``, to build one) is the default backend for sessions that do not
    name their own replicas. ``model_dir`` holds the tokenizer + chat template.
    ``public_host`` is the host put into session URLs (default: ``host``; set it when the
    scaffold reaches the proxy through another address, e.g. from a container).
    ``tokenizer`` (an already loaded HF tokenizer) may be given instead of ``model_dir``.
    The model profile (proxy.profiles) is detected here from the template and the directory's
    ``generation_config.json`` (``tokenizer.name_or_path`` when no ``model_dir``), with
    ``profile`` (field overrides) on top; a template the proxy cannot serve, or a profile naming
    a parser that is not registered while the defaults say ``"auto"``, raises
    ``UnsupportedTemplate`` here, before any session opens.
    Sessions that name their own replicas share one pool per replica set, built by
    ``pool_factory`` (``proxy.pool.SharedPools``). Slow senders: a connection without a
    complete request head ``header_timeout_s`` after connecting (or after its last answer,
    when idle) is closed; a body not received within ``body_timeout_s`` is answered 408.
    """

    def __init__(
        self,
        *,
        model_dir: str | Path | None = None,
        tokenizer: Any = None,
        host: str = "127.0.0.1",
        port: int = 0,
        replicas: Iterable[str] = (),
        pool: ReplicaPool | None = None,
        defaults: SessionConfig | None = None,
        public_host: str | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        keepalive_s: float = 5.0,
        pool_factory: Callable[[Sequence[str]], ReplicaPool] = ReplicaPool,
        profile: Mapping[str, Any] | None = None,
        management_socket: str | Path | None = None,
        management_port: int = 0,
        management_token: str | None = None,
        header_timeout_s: float = 75.0,
        body_timeout_s: float = 60.0,
        large_body_bytes: int = DEFAULT_LARGE_BODY_BYTES,
        session_max_requests: int = DEFAULT_MAX_REQUESTS,
        session_max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        session_max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if tokenizer is None:
            if model_dir is None:
                raise ValueError("ProxyServer needs model_dir or tokenizer")
            from transformers import AutoTokenizer  # heavy import, only when a server is built

            tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.tokenizer = tokenizer
        self.defaults = defaults or SessionConfig()
        source_dir = model_dir if model_dir is not None else getattr(tokenizer, "name_or_path", None)
        self.profile = detect_profile(
            tokenizer, generation_eos=load_generation_eos(source_dir or None), overrides=profile
        )
        _check_parsers(self.profile, self.defaults)
        # the parsers the defaults resolve to are made once (harmony without its vocabulary
        # fails here, at start-up, not in every session)
        check_parsers(
            self.profile.reasoning_parser
            if self.defaults.reasoning_parser == "auto"
            else self.defaults.reasoning_parser,
            self.profile.tool_parser if self.defaults.tool_parser == "auto" else self.defaults.tool_parser,
        )
        log.info("model profile: %s", self.profile)
        # one per proxy: every session renders with the same tokenizer and template
        self.prefix_cache = PrefixCache(self.profile.header_boundary or tokenizer.eos_token)
        # the token bound of early refusals (proxy.token_bound), taken now so that the first
        # session's creation on the event loop does not read the whole vocabulary
        log.info("token bound: %s", TokenBound.of(tokenizer))
        self.host, self.port = host, port
        self.public_host = public_host or host
        self.pool = pool if pool is not None else ReplicaPool(replicas)
        self.shared_pools = SharedPools(pool_factory)
        self.max_body_bytes = max_body_bytes
        self.large_body_bytes = large_body_bytes
        self._workers: ThreadPoolExecutor | None = None  # for large bodies, while started
        self.keepalive_s = keepalive_s
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s
        self.session_max_requests, self.session_max_queued_bytes = (
            session_max_requests,
            session_max_queued_bytes,
        )
        self.session_max_connections = session_max_connections
        self._sessions: dict[str, _Entry] = {}
        self._turns: set[asyncio.Future[TurnOutcome]] = set()
        self._background: set[asyncio.Future[None]] = set()
        self._runner: web.AppRunner | None = None
        self._management_runner: web.AppRunner | None = None
        self.management_socket = Path(management_socket) if management_socket else None
        self.management_port = management_port
        self.management_token = management_token or secrets.token_urlsafe(32)
        self.app = self._protocol_app(prefix="/s/{sid}/{secret}")
        self.management_app = self._build_management_app()

    # -- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        await self.pool.start()
        self._workers = ThreadPoolExecutor(_LARGE_BODY_WORKERS, thread_name_prefix="proxy-large-body")
        # aiohttp closes a connection that has not sent a complete request head within
        # keepalive_timeout of connecting (or of its last answer): the header read timeout
        self._runner = web.AppRunner(
            self.app,
            access_log=None,
            keepalive_timeout=self.header_timeout_s,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._management_runner = web.AppRunner(
            self.management_app,
            access_log=None,
            keepalive_timeout=self.header_timeout_s,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        await self._management_runner.setup()
        if self.management_socket is not None:
            self.management_socket.unlink(missing_ok=True)
            msite: web.BaseSite = web.UnixSite(self._management_runner, str(self.management_socket))
            await msite.start()
            self.management_socket.chmod(0o600)  # the worker's user only
        else:
            msite = web.TCPSite(self._management_runner, self.host, self.management_port)
            await msite.start()
            self.management_port = msite._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    @property
    def management_url(self) -> str:
        """Base URL of the management listener (``http://localhost`` over a Unix socket:
        connect with ``aiohttp.UnixConnector(path=management_socket)``)."""
        if self.management_socket is not None:
            return "http://localhost"
        return f"http://{self.host}:{self.management_port}"

    @property
    def management_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.management_token}"}

    async def stop(self) -> None:
        for sid in list(self._sessions):
            await self.close_session(sid)
        for runner in (self._runner, self._management_runner):
            if runner is not None:
                await runner.cleanup()
        self._runner = self._management_runner = None
        if self._workers is not None:
            self._workers.shutdown(wait=False)
            self._workers = None
        await self.shared_pools.close()
        await self.pool.close()

    async def serve(self) -> None:
        """Run until cancelled (the ``trialflow proxy`` command)."""
        await self.start()
        log.info("proxy listening on %s", self.base_url)
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def __aenter__(self) -> ProxyServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.public_host}:{self.port}"

    # -- in-process management ------------------------------------------------------------
    def open_session(self, config: SessionConfig | None = None) -> SessionHandle:
        """Open a session (``config`` None: the server's defaults). A session naming its own
        replicas is served by the shared pool of that replica set. ``InvalidRequest`` for
        sampling values vLLM would refuse (``SamplingParams.problems``) and for a replica url
        that is not ``http(s)://host[:port]``. Needs a running event loop."""
        config = config or self.defaults
        problems = config.sampling.problems()
        if problems:
            name, why = problems[0]
            raise InvalidRequest(f"sampling.{name}: {why}", param=f"sampling.{name}")
        sid, secret = uuid.uuid4().hex, secrets.token_urlsafe(24)
        try:
            shared = self.shared_pools.acquire(config.replicas) if config.replicas else None
        except ValueError as exc:
            raise InvalidRequest(f"replicas: {exc}", param="replicas") from None
        pool = shared or self.pool
        try:
            session = Session(
                sid, config, self.tokenizer, pool, prefix_cache=self.prefix_cache, profile=self.profile
            )
        except (KeyError, ValueError, TypeError) as exc:
            if shared is not None:
                self._release_later(shared)
            raise InvalidRequest(str(exc.args[0] if isinstance(exc, KeyError) else exc)) from None
        except BaseException:
            if shared is not None:
                self._release_later(shared)
            raise
        gate = RequestGate(self.session_max_requests, self.session_max_queued_bytes)
        self._sessions[sid] = _Entry(session, secret, shared, gate)
        base = f"{self.base_url}/s/{sid}/{secret}"
        return SessionHandle(sid, secret, base, f"{base}/v1")

    async def close_session(self, session_id: str) -> Trajectory:
        """Close a session (waiting for a running turn) and return its trajectory.
        Raises ``NotFound`` for an unknown or already closed session."""
        entry = self._sessions.pop(session_id, None)
        if entry is None:
            raise NotFound(f"unknown session {session_id}")
        for server, runner in entry.listeners:
            server.close()
            await runner.cleanup()
        try:
            trajectory = await entry.session.close()
        finally:
            self.pool.forget(session_id)
            if entry.shared_pool is not None:
                await self.shared_pools.release(entry.shared_pool)
        return trajectory

    def _release_later(self, pool: ReplicaPool) -> None:
        task = asyncio.ensure_future(self.shared_pools.release(pool))
        self._background.add(task)  # a strong reference until it ends
        task.add_done_callback(self._background.discard)

    async def serve_session(self, session_id: str, sock: socket.socket) -> str:
        """Serve only this session's protocol routes, without the id and secret in the path
        (``/v1/messages``, ``/v1/chat/completions``, ...), on a listening socket the caller
        made, typically inside a sandbox's network namespace (``Sandbox.listen_loopback``).
        Returns the base URL a client there uses (``http://127.0.0.1:PORT``); the OpenAI base
        is that + ``/v1``. The listener closes with the session. Nothing else is reachable
        through it: no management route, no other session. It holds at most
        ``session_max_connections`` connections (``proxy.limits.capped``: the one over is
        answered 503 and closed), each closed when idle for ``header_timeout_s``."""
        entry = self._sessions.get(session_id)
        if entry is None:
            raise NotFound(f"unknown session {session_id}")
        app = self._protocol_app(prefix="")
        app[_BOUND] = (session_id, entry.secret)
        runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
            keepalive_timeout=self.header_timeout_s,
        )
        await runner.setup()
        assert runner.server is not None  # set up
        try:
            server = await asyncio.get_running_loop().create_server(
                capped(runner.server, self.session_max_connections), sock=sock
            )
        except BaseException:
            await runner.cleanup()
            raise
        entry.listeners.append((server, runner))
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def session_stats(self, session_id: str) -> SessionStats:
        entry = self._sessions.get(session_id)
        if entry is None:
            raise NotFound(f"unknown session {session_id}")
        return entry.session.stats()

    def set_policy_version(self, version: int) -> int:
        """A weight sync: the replicas now serve ``version``. Every open session records it
        from now on (a turn running across the change records both versions); sessions opened
        later start from it. Returns the number of sessions updated."""
        self.defaults = replace(self.defaults, policy_version=version)
        for entry in self._sessions.values():
            entry.session.set_policy_version(version)
        return len(self._sessions)

    async def _read_json(self, request: web.Request) -> Any:
        return _decode_json(await self._read_body(request))

    async def _read_body(self, request: web.Request) -> bytes:
        return await _read_body(request, self.max_body_bytes, self.body_timeout_s)

    async def _parse(self, request: web.Request, parse: Callable[[Any], T]) -> tuple[T, bool]:
        """``parse`` of the request's decoded JSON body, and whether the body is large: then
        it is decoded and parsed in the worker thread (module docstring)."""
        raw = await self._read_body(request)
        if len(raw) < self.large_body_bytes:
            return parse(_decode_json(raw)), False
        return await self._off_loop(lambda: parse(_decode_json(raw))), True

    async def _off_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` in the worker thread (inline when the server is not started)."""
        if self._workers is None:
            return fn()
        return await asyncio.get_running_loop().run_in_executor(self._workers, fn)

    def session(self, session_id: str) -> Session:
        """The live ``Session`` (tests and the worker read its trajectory)."""
        entry = self._sessions.get(session_id)
        if entry is None:
            raise NotFound(f"unknown session {session_id}")
        return entry.session

    # -- app ------------------------------------------------------------------------------
    def _build_management_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._require_token])
        r = app.router
        r.add_post("/sessions", self._create)
        r.add_get("/sessions/{sid}", self._stats)
        r.add_post("/sessions/{sid}/close", self._close)
        r.add_post("/policy_version", self._policy_version)
        r.add_get("/replicas", self._replicas)
        r.add_post("/replicas", self._change_replicas)
        return app

    @web.middleware
    async def _gated(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """The session's `RequestGate` around a protocol request: a place is taken before
        the body is read (a chunked body counts as the body limit), or 429 in the
        protocol's shape. Requests for no known session go on to their 404."""
        bound = request.app.get(_BOUND)
        entry = self._sessions.get(bound[0] if bound else request.match_info.get("sid", ""))
        if entry is None:
            return await handler(request)
        declared = request.content_length
        if declared is None:
            declared = self.max_body_bytes if request.body_exists else 0
        try:
            with entry.gate.admit(min(declared, self.max_body_bytes)):
                return await handler(request)
        except TooManyRequests as exc:
            if declared >= self.large_body_bytes and request.transport is not None:
                # Not read, not drained: aiohttp would read and discard the body on the event
                # loop (a flood of 7.4 MiB bodies: ~1 GB/s of it, the other sessions' p90
                # 100x), and closing at once lets the flooder resend at once. With reading
                # paused its send blocks until aiohttp's lingering close (10 s), bounded by
                # the listener's connection cap; the answer is written meanwhile.
                request.transport.pause_reading()
            anthropic = "/v1/messages" in request.path or "anthropic-version" in request.headers
            return _error((anthropic_api if anthropic else openai_api).render_error(exc))

    @web.middleware
    async def _require_token(self, request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.management_token}".encode()):
            return _json_response(
                {"error": {"type": "Unauthorized", "message": "management token missing or wrong"}},
                status=401,
            )
        return await handler(request)

    def _session_with_secret(self, request: web.Request) -> str:
        """The path's session id when the request carries that session's secret; a wrong
        or missing secret is the same 404 as an unknown session."""
        sid = request.match_info["sid"]
        entry = self._sessions.get(sid)
        given = request.headers.get("X-Trialflow-Session-Secret", "")
        if entry is None or not hmac.compare_digest(entry.secret.encode(), given.encode()):
            raise NotFound(f"unknown session {sid}")
        return sid

    def _protocol_app(self, prefix: str) -> web.Application:
        """The protocol routes under ``prefix`` (``/s/{sid}/{secret}``, or "" on a
        session-bound listener)."""
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._gated])
        r = app.router
        r.add_post(f"{prefix}/v1/messages", self._anthropic_messages)
        r.add_post(f"{prefix}/v1/messages/count_tokens", self._anthropic_count_tokens)
        r.add_post(f"{prefix}/v1/chat/completions", self._openai_chat)
        r.add_post(f"{prefix}/v1/responses", self._openai_responses)
        r.add_get(f"{prefix}/v1/models", self._models)
        r.add_route("*", prefix + "/{tail:.*}", self._unknown_route)
        return app

    # -- management handlers --------------------------------------------------------------
    # Each raises ProxyError for a bad request; ``_management`` answers it as a JSON error.
    @_management
    async def _create(self, request: web.Request) -> web.Response:
        body = await self._read_json(request) if request.can_read_body else {}
        try:
            config = self.defaults.with_overrides(body)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(str(exc)) from None
        handle = self.open_session(config)
        return _json_response(
            {
                "session_id": handle.session_id,
                "secret": handle.secret,
                "anthropic_base_url": handle.anthropic_base_url,
                "openai_base_url": handle.openai_base_url,
            }
        )

    @_management
    async def _policy_version(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        version = body.get("version") if isinstance(body, dict) else None
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidRequest('body must be {"version": <int>}')
        return _json_response({"version": version, "sessions": self.set_policy_version(version)})

    async def _replicas(self, request: web.Request) -> web.Response:
        return _json_response(self.replica_listing())

    @_management
    async def _change_replicas(self, request: web.Request) -> web.Response:
        add, remove = _replica_changes(await self._read_json(request))
        for url in add:
            self.pool.add_replica(url)
        for url in remove:
            self.pool.remove_replica(url)
        if add or remove:
            log.info("replicas changed: +%s -%s", add, remove)
        return _json_response(self.replica_listing())

    def replica_listing(self) -> dict[str, Any]:
        """The default pool's replicas, and each shared pool's with the sessions it serves."""
        return {
            "replicas": _replica_rows(self.pool),
            "shared": [
                {"sessions": refs, "replicas": _replica_rows(pool)}
                for pool, refs in self.shared_pools.pools()
            ],
        }

    def replica_loads(self) -> dict[str, ReplicaLoad]:
        """Each replica's load at its pool's last health round, by url, over the default pool
        and the shared ones (replicas whose /metrics gave none are left out)."""
        pools = [self.pool, *(pool for pool, _ in self.shared_pools.pools())]
        return {r.url: r.load for pool in pools for r in pool.replicas if r.load is not None}

    @_management
    async def _stats(self, request: web.Request) -> web.Response:
        return _json_response(asdict(self.session_stats(self._session_with_secret(request))))

    @_management
    async def _close(self, request: web.Request) -> web.Response:
        trajectory = await self.close_session(self._session_with_secret(request))
        if request.query.get("format") == "json":
            return _json_response(Session.summary(trajectory))
        return web.Response(body=trajectory.to_bytes(), content_type="application/octet-stream")

    # -- protocol handlers ----------------------------------------------------------------
    def _lookup(self, request: web.Request) -> Session:
        bound = request.app.get(_BOUND)
        sid, secret = bound if bound else (request.match_info["sid"], request.match_info["secret"])
        entry = self._sessions.get(sid)
        if entry is None or not hmac.compare_digest(entry.secret, secret):
            raise NotFound("unknown session")
        return entry.session

    async def _anthropic_messages(self, request: web.Request) -> web.StreamResponse:
        render = anthropic_api.render_error
        try:
            session = self._lookup(request)
            memo = session.message_memo
            chat, large = await self._parse(request, lambda b: anthropic_api.parse_messages_request(b, memo))
        except _CLIENT_ERRORS as exc:
            return _error(render(_client_error(exc)))
        session.note_ignored(chat.ignored_fields)
        model = chat.model or session.config.model

        def events(outcome: TurnOutcome) -> Iterable[bytes]:
            stream = anthropic_api.stream_events(outcome, model=model, message_id=outcome.response_id)
            for name, data in stream:
                yield anthropic_api.sse(name, data)

        return await self._turn(
            request,
            session,
            chat,
            large=large,
            render_json=lambda o: anthropic_api.build_message(o, model=model, message_id=o.response_id),
            render_stream=events,
            keepalive=anthropic_api.sse(*anthropic_api.ping_event()),
            render_error=render,
            stream_error=lambda exc: anthropic_api.sse(*anthropic_api.error_event(exc)),
        )

    async def _anthropic_count_tokens(self, request: web.Request) -> web.Response:
        try:
            session = self._lookup(request)
            memo = session.message_memo
            chat, large = await self._parse(
                request, lambda b: anthropic_api.parse_count_tokens_request(b, memo)
            )
            n = (
                await self._off_loop(lambda: session.count_tokens(chat))
                if large
                else session.count_tokens(chat)
            )
        except _CLIENT_ERRORS as exc:
            return _error(anthropic_api.render_error(_client_error(exc)))
        return _json_response(anthropic_api.count_tokens_response(n))

    async def _openai_chat(self, request: web.Request) -> web.StreamResponse:
        render = openai_api.render_error
        try:
            session = self._lookup(request)
            memo = session.message_memo
            chat, large = await self._parse(request, lambda b: openai_api.parse_chat_request(b, memo))
        except _CLIENT_ERRORS as exc:
            return _error(render(_client_error(exc)))
        session.note_ignored(chat.ignored_fields)
        model = chat.model or session.config.model

        def chunks(outcome: TurnOutcome) -> Iterable[bytes]:
            for chunk in openai_api.stream_chunks(
                outcome,
                model=model,
                completion_id=outcome.response_id,
                created=outcome.created,
                include_usage=chat.stream_usage,
            ):
                yield openai_api.sse_chunk(chunk)
            yield openai_api.SSE_DONE

        return await self._turn(
            request,
            session,
            chat,
            large=large,
            render_json=lambda o: openai_api.build_chat_completion(
                o, model=model, completion_id=o.response_id, created=o.created
            ),
            render_stream=chunks,
            keepalive=openai_api.SSE_KEEPALIVE,
            render_error=render,
            stream_error=openai_api.sse_error,
        )

    async def _openai_responses(self, request: web.Request) -> web.StreamResponse:
        render = responses_api.render_error
        try:
            session = self._lookup(request)
            memo = session.message_memo
            parsed, large = await self._parse(
                request, lambda b: responses_api.parse_responses_request(b, memo)
            )
        except _CLIENT_ERRORS as exc:
            return _error(render(_client_error(exc)))
        chat = parsed.chat
        session.note_ignored(chat.ignored_fields)

        def ids(outcome: TurnOutcome) -> dict[str, Any]:
            return {"response_id": outcome.response_id, "created_at": outcome.created}

        def events(outcome: TurnOutcome) -> Iterable[bytes]:
            for event in responses_api.stream_events(outcome, parsed, **ids(outcome)):
                yield responses_api.sse_event(event)

        # A failure has no outcome: its ``response.failed`` event gets a fresh id and the time.
        failed_id, failed_at = responses_api.new_response_id(), int(time.time())
        return await self._turn(
            request,
            session,
            chat,
            large=large,
            render_json=lambda o: responses_api.build_response(o, parsed, **ids(o)),
            render_stream=events,
            keepalive=responses_api.SSE_KEEPALIVE,
            render_error=render,
            stream_error=lambda exc: responses_api.stream_error_event(
                exc, parsed, response_id=failed_id, created_at=failed_at
            ),
        )

    async def _models(self, request: web.Request) -> web.Response:
        anthropic = "anthropic-version" in request.headers
        try:
            session = self._lookup(request)
        except ProxyError as exc:
            return _error((anthropic_api if anthropic else openai_api).render_error(exc))
        names = [session.config.model]
        if anthropic:
            return _json_response(anthropic_api.models_response(names))
        return _json_response(openai_api.models_response(names, await session.context_limit()))

    async def _unknown_route(self, request: web.Request) -> web.Response:
        api = anthropic_api if "anthropic-version" in request.headers else openai_api
        return _error(api.render_error(NotFound(f"no route {request.method} {request.match_info['tail']}")))

    async def _turn(
        self,
        request: web.Request,
        session: Session,
        chat: ChatRequest,
        *,
        large: bool,
        render_json: Callable[[TurnOutcome], dict[str, Any]],
        render_stream: Callable[[TurnOutcome], Iterable[bytes]],
        keepalive: bytes,
        render_error: Callable[[BaseException], tuple[int, dict[str, Any]]],
        stream_error: Callable[[BaseException], bytes],
    ) -> web.StreamResponse:
        """Run one turn and answer it, as JSON or as an event stream (module docstring); a
        ``large`` request's turn is prepared in the worker thread."""
        # Response and tool-call ids come from the session (derived from its id seed and the
        # turn, or from the record when the turn is replayed): see proxy.ids.
        task = asyncio.ensure_future(session.run_turn(chat, offload=self._off_loop if large else None))
        # A strong reference: the turn must finish (and be recorded) even if this handler
        # ends early because the client went away.
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)
        # Wait a little before committing to a 200 stream, so fast failures keep their status.
        done, _ = await asyncio.wait({task}, timeout=self.keepalive_s if chat.stream else None)
        if done or not chat.stream:
            try:
                outcome = task.result()
            except Exception as exc:  # noqa: BLE001 - rendered in the protocol's shape
                exc = _client_error(exc)
                return _error(render_error(exc), log_unexpected=not isinstance(exc, ProxyError))
            if not chat.stream:
                return _json_response(render_json(outcome))
            return await _stream(request, render_stream(outcome))
        resp = await _start_stream(request)
        try:
            while not task.done():
                await resp.write(keepalive)
                await asyncio.wait({task}, timeout=self.keepalive_s)
            try:
                outcome = task.result()
            except Exception as exc:  # noqa: BLE001 - sent as the protocol's error event
                exc = _client_error(exc)
                if not isinstance(exc, ProxyError):
                    log.exception("turn failed unexpectedly")
                await resp.write(stream_error(exc))
                return resp
            await resp.write(b"".join(render_stream(outcome)))
        except ConnectionResetError:
            log.info(
                "session %s: client went away during a streamed turn (the turn is still recorded)", session.id
            )
        return resp


async def _start_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def _stream(request: web.Request, body: Iterable[bytes]) -> web.StreamResponse:
    """A finished turn's whole event stream, in one write (one syscall, not one per event)."""
    resp = await _start_stream(request)
    await resp.write(b"".join(body))
    return resp


def _replica_rows(pool: ReplicaPool) -> list[dict[str, Any]]:
    return [
        {
            "url": r.url,
            "up": r.up,
            "in_flight": r.in_flight,
            "served": r.served,
            "failures": r.failures,
            "sessions": r.sessions,
            "tokens_per_s": r.tokens_per_s,
            "max_model_len": r.max_model_len,
            "load": asdict(r.load) if r.load is not None else None,
        }
        for r in pool.replicas
    ]


def _replica_changes(body: Any) -> tuple[list[str], list[str]]:
    """(urls to add, urls to remove) from a ``POST /replicas`` body; ``InvalidRequest`` if any
    part is malformed, so a bad body changes nothing."""
    if not isinstance(body, dict) or not body or set(body) - {"add", "remove"}:
        raise InvalidRequest('body must be {"add": [url, ...], "remove": [url, ...]} (either or both)')
    out: list[list[str]] = []
    for key in ("add", "remove"):
        urls = body.get(key, [])
        if not isinstance(urls, list):
            raise InvalidRequest(f"{key} must be a list of urls", param=key)
        try:
            urls = [replica_url(u) for u in urls]
        except ValueError as exc:
            raise InvalidRequest(f"{key}: {exc}", param=key) from None
        out.append(urls)
    return out[0], out[1]


# What a client's body can cause besides ProxyError: nesting too deep for the encoders
# (jsonio.TooDeep) or, past every check, for the Python stack (a chat template rendering a
# deep tool schema). Both are the client's 400, never a 500.
_CLIENT_ERRORS = (ProxyError, jsonio.TooDeep, RecursionError)


def _client_error(exc: Exception) -> Exception:
    if isinstance(exc, (jsonio.TooDeep, RecursionError)):
        return InvalidRequest(f"request nested too deeply: {exc}")
    return exc


def _json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=jsonio.dumps(body), status=status, content_type="application/json")


async def _read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The body. ``PayloadTooLarge`` over ``limit``; ``RequestTimeout`` when it has not
    arrived within ``timeout_s``."""
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(request.content_length, limit)
    try:
        async with asyncio.timeout(timeout_s):
            raw = await request.read()
    except TimeoutError:  # aiohttp closes the connection after the answer: its body is unread
        raise RequestTimeout(timeout_s) from None
    except web.HTTPRequestEntityTooLarge:
        # a chunked body (no Content-Length) cut off by aiohttp once past client_max_size
        raise PayloadTooLarge(None, limit) from None
    return raw


def _decode_json(raw: bytes) -> Any:
    """The decoded JSON body; ``InvalidRequest`` if not JSON or nested too deeply."""
    try:
        return jsonio.loads(raw)
    except jsonio.TooDeep as exc:
        raise InvalidRequest(f"request body: {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None


def _error(rendered: tuple[int, dict[str, Any]], log_unexpected: bool = False) -> web.Response:
    status, body = rendered
    if log_unexpected or status >= 500:
        log.warning("answering %d: %s", status, body)
    return _json_response(body, status=status)


def _mgmt_error(exc: ProxyError) -> web.Response:
    return _json_response({"error": {"type": type(exc).__name__, "message": exc.message}}, status=exc.status)
