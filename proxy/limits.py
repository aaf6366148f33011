"""Limits of one session's listener, so one sandbox cannot take the proxy's memory or the
worker's file descriptors (issue 20): what a session may have in flight, and how many
connections its listener holds.

- `RequestGate`: per session, at most `max_requests` requests in flight and at most
  `max_queued_bytes` of their bodies (by Content-Length; a chunked body counts as the
  server's body limit, its worst case) admitted before a body is read. Over either:
  `TooManyRequests` (429 in the protocol's error shape; both official SDKs retry a 429 with
  backoff), and the body is never read. A real agent has one turn in flight and a side
  request or two (Claude Code's count_tokens and title calls), so the defaults (8 requests,
  32 MiB) never bind on honest traffic.
- `capped(factory, max_connections)`: a protocol factory for a listener that holds at most
  `max_connections` connections; the one over the cap is answered at once with a 503 and
  closed, so it costs its file descriptor for microseconds. The request is not read (that
  would cost the descriptor for as long as the client takes), so the protocol is unknown:
  the body carries both shapes' fields (``{"type": "error", "error": {"type", "message",
  "code"}}`` reads as Anthropic's and as OpenAI's error object).
- `serve_paused(sock, factory, max_connections)`: the other way to cap a listener: at the
  cap it stops accepting, so further connections wait in the kernel's backlog (no
  descriptor, no event-loop work) until one closes. Used where the client's own timeout is
  the clear error (the egress proxy: pip and npm report a connect timeout): a flooder
  then costs the worker nothing per attempt, where refusing costs an accept, a write and a
  close each on the shared event loop (docs/benchmarks.md, "Listener floods").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from proxy.errors import TooManyRequests

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUESTS = 8
DEFAULT_MAX_QUEUED_BYTES = 32 << 20
DEFAULT_MAX_CONNECTIONS = 64


@dataclass
class RequestGate:
    """In-flight requests and body bytes of one session (module docstring)."""

    max_requests: int = DEFAULT_MAX_REQUESTS
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    requests: int = 0
    queued_bytes: int = 0

    @contextlib.contextmanager
    def admit(self, declared_bytes: int) -> Iterator[None]:
        """Hold a place for one request with a body of `declared_bytes` while the block
        runs; `TooManyRequests` when it does not fit."""
        if self.requests >= self.max_requests:
            raise TooManyRequests(f"this session already has {self.requests} requests in flight (the limit)")
        if self.queued_bytes + declared_bytes > self.max_queued_bytes:
            raise TooManyRequests(
                f"this session's requests in flight hold {self.queued_bytes} body bytes; "
                f"{declared_bytes} more would pass the limit of {self.max_queued_bytes}"
            )
        self.requests += 1
        self.queued_bytes += declared_bytes
        try:
            yield
        finally:
            self.requests -= 1
            self.queued_bytes -= declared_bytes


def _refusal(max_connections: int) -> bytes:
    message = f"too many connections to this session's listener (limit {max_connections}); retry later"
    body = json.dumps(
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": message, "code": "too_many_connections"},
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class _Refuse(asyncio.Protocol):
    def __init__(self, answer: bytes) -> None:
        self._answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(self._answer)
        transport.close()  # after the answer is flushed


class _Counted(asyncio.Protocol):
    """Delegates to the real protocol and counts the connection until it is lost."""

    def __init__(self, inner: asyncio.Protocol, done: Callable[[], None]) -> None:
        self._inner, self._done = inner, done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._done()
        self._inner.connection_lost(exc)


def capped(factory: Callable[[], asyncio.Protocol], max_connections: int) -> Callable[[], asyncio.Protocol]:
    """`factory` for a listener holding at most `max_connections` connections (module
    docstring); the count is taken when a connection is accepted, so a burst cannot
    overshoot it. Refusals are logged at the 1st, 1,000th and every 10,000th."""
    open_now = refused = 0
    answer = _refusal(max_connections)

    def done() -> None:
        nonlocal open_now
        open_now -= 1

    def make() -> asyncio.Protocol:
        nonlocal open_now, refused
        if open_now >= max_connections:
            refused += 1
            if refused in (1, 1000) or refused % 10_000 == 0:
                log.warning("%d connections refused over a listener's cap of %d", refused, max_connections)
            return _Refuse(answer)
        open_now += 1
        return _Counted(factory(), done)

    return make


async def serve_paused(
    sock: socket.socket, factory: Callable[[], asyncio.Protocol], max_connections: int
) -> asyncio.Task[None]:
    """Serve the listening `sock` with `factory`, holding at most `max_connections`
    connections (module docstring). Returns the accept loop's task: cancel it to stop
    accepting (open connections stay with their protocols); the caller closes `sock`."""
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(max_connections)

    async def accept() -> None:
        while True:
            await slots.acquire()
            try:
                conn, _ = await loop.sock_accept(sock)
            except BaseException:
                slots.release()
                raise
            conn.setblocking(False)
            try:
                await loop.connect_accepted_socket(lambda: _Counted(factory(), slots.release), conn)
            except OSError:  # the client went away before it was served
                conn.close()
                slots.release()

    return asyncio.create_task(accept(), name=f"accept-{sock.getsockname()}")
