"""The viewer's aiohttp app: routes (trialflow.viewer._urls) -> `_data` (in a thread) -> `_render`.

Every answer is a whole HTML page. A `ViewerError` (unknown id, unreadable store, corrupt
record) is its one line on an error page with its status; anything else is logged here and
answered 500 with one line, never a traceback. Each page is sent with a Content-Security-Policy
that allows no script, no outside resource and no framing: the pages show agent-written text
(escaped by `_render`), and the policy is the second wall should an escape ever be missed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from trialflow.storage import ResultStore
from trialflow.viewer import _data, _render

log = logging.getLogger(__name__)

CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@dataclass
class Viewer:
    """What the pages are made from: the store (and its description for the index page), the
    model's tokenizer (None: tokens shown as ids) and the Temporal UI the trial pages link to."""

    store: ResultStore
    where: str
    temporal_ui_url: str
    namespace: str = "default"
    tokenizer: Any = None
    cache: _data.TrajectoryCache = field(default_factory=_data.TrajectoryCache)

    def __post_init__(self) -> None:
        self.decode = None if self.tokenizer is None else functools.lru_cache(maxsize=1 << 16)(self._decode)

    def _decode(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8", headers=_HEADERS)


@web.middleware
async def _errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
    try:
        return await handler(request)
    except _data.ViewerError as err:
        return _html(_render.error_page(str(err), err.status), err.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _html(_render.error_page(exc.reason, exc.status), exc.status)
    except Exception as err:  # one line to the user; the traceback only in the viewer's log
        log.exception("viewer page %s failed", request.path)
        return _html(_render.error_page(f"internal error: {type(err).__name__}: {err}", 500), 500)


def _int(request: web.Request, name: str, default: int | None = None, *, query: bool = True) -> int | None:
    raw = request.query.get(name) if query else request.match_info.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _data.ViewerError(f"{name} must be a number, not {raw!r}", 400) from None
    if value < 0:
        raise _data.ViewerError(f"{name} must not be negative", 400)
    return value


def make_app(viewer: Viewer) -> web.Application:
    store = viewer.store

    async def index(request: web.Request) -> web.Response:
        offset = _int(request, "offset", 0) or 0
        batches, total = await asyncio.to_thread(_data.list_batches, store, offset)
        return _html(_render.index_page(batches, viewer.where, total, offset, _data.BATCHES_PER_PAGE))

    async def batch(request: web.Request) -> web.Response:
        offset = _int(request, "offset", 0) or 0
        p = await asyncio.to_thread(_data.batch_page, store, request.match_info["batch_id"], offset)
        return _html(_render.batch_page(p, _data.TRIALS_PER_PAGE))

    def result_of(request: web.Request):
        trial_id = request.match_info["trial_id"]
        batch_id = request.query.get("batch") or _data.find_batch(store, trial_id)
        return _data.read_result(store, batch_id, trial_id)

    async def trial(request: web.Request) -> web.Response:
        def build() -> str:
            result = result_of(request)
            tp = _data.trial_page(store, result, viewer.cache)
            return _render.trial_page(tp, viewer.temporal_ui_url, viewer.namespace)

        return _html(await asyncio.to_thread(build))

    def trajectory_for(request: web.Request):
        result = result_of(request)
        unit = _data.find_unit(
            _data.trial_units(store, result), _int(request, "attempt"), request.query.get("step")
        )
        return result, unit, _data.trajectory_of(viewer.cache.get(store, unit, result))

    async def turn(request: web.Request) -> web.Response:
        def build() -> str:
            n = _int(request, "n", query=False) or 0
            result, unit, traj = trajectory_for(request)
            if not 1 <= n <= len(traj.turns):
                raise _data.NotFound(
                    f"{unit.label} of {result.trial_id} has {len(traj.turns)} turns, no turn {n}"
                )
            return _render.turn_page(result, unit, traj, n, viewer.decode)

        return _html(await asyncio.to_thread(build))

    async def segment(request: web.Request) -> web.Response:
        def build() -> str:
            s = _int(request, "s", query=False) or 0
            result, unit, traj = trajectory_for(request)
            if s >= len(traj.segments):
                raise _data.NotFound(
                    f"{unit.label} of {result.trial_id} has {len(traj.segments)} segments, no segment {s}"
                )
            return _render.segment_page(result, unit, traj, s, _int(request, "offset", 0) or 0, viewer.decode)

        return _html(await asyncio.to_thread(build))

    app = web.Application(middlewares=[_errors])
    app.router.add_get("/", index)
    app.router.add_get("/batch/{batch_id}", batch)
    app.router.add_get("/trial/{trial_id}", trial)
    app.router.add_get("/trial/{trial_id}/turn/{n}", turn)
    app.router.add_get("/trial/{trial_id}/segment/{s}", segment)
    return app


async def start(viewer: Viewer, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve on host:port (0: a free port); returns the runner (``await runner.cleanup()``)
    and the port bound."""
    runner = web.AppRunner(make_app(viewer), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    return runner, (sockets[0].getsockname()[1] if sockets else port)
