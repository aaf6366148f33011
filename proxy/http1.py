"""A small keep-alive HTTP/1.1 client for the proxy's hot path: one JSON POST per turn to vLLM.

Why not aiohttp here: its client machinery (request/response objects, tracing hooks, cookie
and redirect handling) costs about 0.5 ms per call on this project's machines, a quarter of
what the proxy adds per turn (docs/benchmarks.md section 1). The generation call needs none
of it: plain ``http://`` to a known replica, a JSON body, a JSON answer. Health checks and
``/v1/models`` stay on aiohttp (not per turn).

Contract of ``Http1Pool.post(path, body)`` -> ``(status, body bytes)``:
- Connections to the origin are kept alive and reused, one request at a time each; idle ones
  the server has closed are dropped before use. At most ``max_idle`` idle connections are kept.
- Responses with ``Content-Length``, ``Transfer-Encoding: chunked``, or neither (read to EOF,
  then the connection is closed) are read whole; ``1xx`` interim responses are skipped.
- A reused connection that had been idle for ``stale_after_s`` or more and fails before any
  byte of the answer arrived (the server's keep-alive timeout closed it just as the request
  went out) is retried once on a new connection. A connection used more recently than that
  fails the call instead: a server dropping a request it just got is the server's failure,
  reported as such (the replica pool then decides about other replicas).
- Any other failure raises ``Http1Error`` (connection refused/reset, truncated or malformed
  answer) or ``TimeoutError`` (``timeout_s`` for the whole call, ``connect_timeout_s`` for
  opening a connection); the connection involved is closed, never reused.
- A cancelled call closes its connection (its answer would otherwise be read by the next).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

_MAX_HEADER_BYTES = 64 * 1024


class Http1Error(ConnectionError):
    """The request could not be completed (transport failure or a malformed answer)."""


class _Conn:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.idle_since = 0.0

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        self.writer.close()


class _StaleConnection(Exception):
    """A reused connection failed before the answer started (retry on a fresh one)."""


class Http1Pool:
    """Keep-alive connections to ``http://host:port`` (see module docstring)."""

    def __init__(self, host: str, port: int, *, max_idle: int = 64, stale_after_s: float = 1.0) -> None:
        self.host, self.port = host, port
        self.max_idle = max_idle
        self.stale_after_s = stale_after_s
        self._idle: deque[_Conn] = deque()
        self._host_header = f"{host}:{port}".encode()

    async def post(
        self,
        path: str,
        body: bytes,
        *,
        timeout_s: float | None = None,
        connect_timeout_s: float = 5.0,
        content_type: str = "application/json",
    ) -> tuple[int, bytes]:
        head = (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: "
            + self._host_header
            + b"\r\nContent-Type: "
            + content_type.encode()
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
        )
        async with asyncio.timeout(timeout_s):
            conn, idle_s = await self._acquire(connect_timeout_s)
            try:
                return await self._exchange(conn, head + body, may_be_stale=idle_s >= self.stale_after_s)
            except _StaleConnection:
                conn, _ = await self._open(connect_timeout_s)
                return await self._exchange(conn, head + body, may_be_stale=False)

    async def close(self) -> None:
        while self._idle:
            self._idle.popleft().close()

    # -- connections ------------------------------------------------------------------------
    async def _acquire(self, connect_timeout_s: float) -> tuple[_Conn, float]:
        """A connection and how long it has been idle (0 for a new one)."""
        while self._idle:
            conn = self._idle.pop()  # most recently used first: least likely to be timed out
            if conn.usable():
                return conn, time.monotonic() - conn.idle_since
            conn.close()
        return await self._open(connect_timeout_s)

    async def _open(self, connect_timeout_s: float) -> tuple[_Conn, float]:
        try:
            async with asyncio.timeout(connect_timeout_s):
                reader, writer = await asyncio.open_connection(self.host, self.port, limit=_MAX_HEADER_BYTES)
        except OSError as exc:
            raise Http1Error(f"connect to {self.host}:{self.port} failed: {exc}") from exc
        return _Conn(reader, writer), 0.0

    def _release(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        if conn.usable() and len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn.close()

    # -- one request ------------------------------------------------------------------------
    async def _exchange(self, conn: _Conn, request: bytes, may_be_stale: bool) -> tuple[int, bytes]:
        keep = False
        try:
            try:
                conn.writer.write(request)
                await conn.writer.drain()
                status_line = await conn.reader.readuntil(b"\r\n")
            except (OSError, asyncio.IncompleteReadError) as exc:
                if may_be_stale and not getattr(exc, "partial", b""):
                    raise _StaleConnection from exc
                raise Http1Error(f"no answer from {self.host}:{self.port}: {exc!r}") from exc
            status, body, keep = await self._read_response(conn.reader, status_line)
            return status, body
        except Http1Error:
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise Http1Error(f"bad answer from {self.host}:{self.port}: {exc!r}") from exc
        finally:
            # on any exit but a complete keep-alive answer (errors, cancellation, timeout)
            # the connection's state is unknown: close it
            if keep:
                self._release(conn)
            else:
                conn.close()

    @staticmethod
    async def _read_response(reader: asyncio.StreamReader, status_line: bytes) -> tuple[int, bytes, bool]:
        while True:
            version, status = _parse_status(status_line)
            headers = await _read_headers(reader)
            if not 100 <= status < 200:
                break
            status_line = await reader.readuntil(b"\r\n")  # interim answer: the real one follows
        connection = headers.get(b"connection", b"").lower()
        keep = connection != b"close" and (version == b"HTTP/1.1" or connection == b"keep-alive")
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            body = await _read_chunked(reader)
        elif b"content-length" in headers:
            body = await reader.readexactly(int(headers[b"content-length"]))
        elif status in (204, 304):
            body = b""
        else:
            body, keep = await reader.read(), False
        return status, body, keep


def _parse_status(line: bytes) -> tuple[bytes, int]:
    parts = line.rstrip(b"\r\n").split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"malformed status line {line[:80]!r}")
    return parts[0], int(parts[1])


async def _read_headers(reader: asyncio.StreamReader) -> dict[bytes, bytes]:
    """Header lines up to the empty line that ends them (also used for chunked trailers)."""
    headers: dict[bytes, bytes] = {}
    total = 0
    while True:
        line = await reader.readuntil(b"\r\n")
        total += len(line)
        if line == b"\r\n":
            return headers
        if total > _MAX_HEADER_BYTES:
            raise ValueError("response headers too large")
        name, sep, value = line.partition(b":")
        if not sep:
            raise ValueError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            await _read_headers(reader)  # trailers (usually none) and the final empty line
            return bytes(out)
        out += await reader.readexactly(size)
        if await reader.readexactly(2) != b"\r\n":
            raise ValueError("chunk not terminated by CRLF")
