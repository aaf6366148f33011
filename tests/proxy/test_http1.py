"""proxy.http1 against a raw asyncio HTTP server whose every byte the test scripts.

aiohttp and uvicorn (vLLM) are covered elsewhere (test_backend, test_vllm_exact); here the
server writes exact bytes so framing cases the real servers seldom produce are covered too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from proxy.http1 import Http1Error, Http1Pool
from tests._wait import wait_until

Answer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # -> keep the connection open


def ok(body: bytes = b'{"ok":1}', extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s" % (
        len(body),
        extra,
        body,
    )


class RawServer:
    """Reads one request at a time (headers + Content-Length body) and lets ``answer`` write."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.requests: list[bytes] = []

    async def __aenter__(self) -> RawServer:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                body = await reader.readexactly(length)
                self.requests.append(body)
                if not await self.answer(body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()


def replies(*chunks: bytes, keep: bool = True) -> Answer:
    async def answer(body: bytes, writer: asyncio.StreamWriter) -> bool:
        for c in chunks:
            writer.write(c)
            await writer.drain()
        return keep

    return answer


async def test_keep_alive_reuses_one_connection():
    async def echo(body, writer):
        writer.write(ok(body))
        return True

    async with RawServer(echo) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        for i in range(3):
            assert await pool.post("/v1/completions", b'{"i":%d}' % i) == (200, b'{"i":%d}' % i)
        await pool.close()
    assert srv.connections == 1 and len(srv.requests) == 3


async def test_concurrent_calls_get_their_own_connections_and_answers():
    async def slow_echo(body, writer):
        await asyncio.sleep(0.05)
        writer.write(ok(body))
        return True

    async with RawServer(slow_echo) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        got = await asyncio.gather(*(pool.post("/x", b"%d" % i) for i in range(5)))
        assert [b for _, b in got] == [b"%d" % i for i in range(5)] and srv.connections == 5
        await pool.post("/x", b"again")
        assert srv.connections == 5  # an idle one was reused
        await pool.close()


@pytest.mark.parametrize(
    "wire, body",
    [
        # chunked, with a chunk extension and a trailer
        (
            b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\n{"a"\r\n3\r\n:1}\r\n0\r\nX-T: 1\r\n\r\n',
            b'{"a":1}',
        ),
        # an interim 100 Continue before the real answer
        (b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"[]"), b"[]"),
        # empty body
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b""),
    ],
)
async def test_framings(wire, body):
    async with RawServer(replies(wire)) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        assert await pool.post("/x", b"{}") == (200, body)
        assert await pool.post("/x", b"{}") == (200, body)  # framing consumed exactly: reusable
        await pool.close()
    assert srv.connections == 1


async def test_no_length_reads_to_eof_and_connection_close_is_honoured():
    async with RawServer(
        replies(b"HTTP/1.1 503 Busy\r\nContent-Type: text/plain\r\n\r\nbusy", keep=False)
    ) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        assert await pool.post("/x", b"{}") == (503, b"busy")
        assert await pool.post("/x", b"{}") == (503, b"busy")
        await pool.close()
    assert srv.connections == 2
    async with RawServer(replies(ok(extra=b"Connection: close\r\n"))) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        await pool.post("/x", b"{}")
        await pool.post("/x", b"{}")
        await pool.close()
    assert srv.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_used():
    """The server closes each connection after answering; the pool notices the EOF and opens
    a new one instead of failing the next call."""
    async with RawServer(replies(ok(), keep=False)) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        await pool.post("/x", b"{}")
        await wait_until(lambda: not pool._idle[-1].usable(), what="the server's FIN")
        assert await pool.post("/x", b"{}") == (200, b'{"ok":1}')
        await pool.close()
    assert srv.connections == 2


async def test_stale_connection_retry_only_after_idling():
    """A server that reads a request and closes without answering: after an idle period that
    looks like a keep-alive timeout race and is retried once on a new connection; right after
    a previous answer it is the server's failure."""
    calls = 0

    async def drop_second(body, writer):
        nonlocal calls
        calls += 1
        if calls == 2:
            return False  # close without answering
        writer.write(ok())
        return True

    async with RawServer(drop_second) as srv:
        pool = Http1Pool("127.0.0.1", srv.port, stale_after_s=0.0)
        await pool.post("/x", b"{}")
        assert await pool.post("/x", b"{}") == (200, b'{"ok":1}')  # retried on a new connection
        await pool.close()
    assert srv.connections == 2 and calls == 3
    calls = 0
    async with RawServer(drop_second) as srv:
        pool = Http1Pool("127.0.0.1", srv.port, stale_after_s=60.0)
        await pool.post("/x", b"{}")
        with pytest.raises(Http1Error):
            await pool.post("/x", b"{}")
        await pool.close()
    assert calls == 2


async def test_timeout_and_cancellation_close_the_connection():
    """The late answer of a timed-out call must never be read as the next call's answer."""
    answers = iter([b"late", b"next", b"after-cancel"])

    async def slow_first(body, writer):
        text = next(answers)
        if text != b"next":
            await asyncio.sleep(0.4)
        writer.write(ok(text))
        return True

    async with RawServer(slow_first) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        with pytest.raises(TimeoutError):
            await pool.post("/x", b"{}", timeout_s=0.1)
        assert await pool.post("/x", b"{}") == (200, b"next")
        task = asyncio.create_task(pool.post("/x", b"{}"))
        await wait_until(lambda: len(srv.requests) == 3, what="the third call at the server")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not pool._idle  # the cancelled call's connection was closed, not pooled
        await pool.close()


@pytest.mark.parametrize(
    "wire",
    [
        b"SMTP ready\r\n\r\n",  # not HTTP
        b"HTTP/1.1 200 OK\r\nno-colon-here\r\n\r\n",  # malformed header
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # truncated body
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # bad chunk size
    ],
)
async def test_malformed_answers_raise_http1_error(wire):
    async with RawServer(replies(wire, keep=False)) as srv:
        pool = Http1Pool("127.0.0.1", srv.port)
        with pytest.raises(Http1Error):
            await pool.post("/x", b"{}")
        await pool.close()


async def test_refused_connection_is_http1_error():
    async with RawServer(replies(ok())) as srv:
        port = srv.port
    with pytest.raises(Http1Error, match="connect"):
        await Http1Pool("127.0.0.1", port).post("/x", b"{}")
