"""What the attack tests measure on the worker's side (this process: the worker and its
proxy run in-process): resident memory, open descriptors and their peaks while an attack
runs, and a host service standing in for the worker's own (S3, Temporal) or a package index."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@dataclass
class Peaks:
    rss_mib: float
    fds: int
    base_rss_mib: float
    base_fds: int

    @property
    def rss_growth_mib(self) -> float:
        return self.rss_mib - self.base_rss_mib

    @property
    def fd_growth(self) -> int:
        return self.fds - self.base_fds


@asynccontextmanager
async def peaks(interval_s: float = 0.02) -> AsyncIterator[Peaks]:
    """The block's peak RSS and descriptor count, sampled every `interval_s`."""
    seen = Peaks(rss_mib(), fd_count(), rss_mib(), fd_count())

    async def sample() -> None:
        while True:
            seen.rss_mib, seen.fds = max(seen.rss_mib, rss_mib()), max(seen.fds, fd_count())
            await asyncio.sleep(interval_s)

    sampler = asyncio.create_task(sample())
    try:
        yield seen
    finally:
        sampler.cancel()


async def text_service(host: str, text: str) -> tuple[web.AppRunner, int]:
    """An HTTP server on `host` (a free port) answering every GET with `text`."""
    app = web.Application()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=text)

    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind((host, 0))
    await web.SockSite(runner, sock).start()
    return runner, sock.getsockname()[1]
