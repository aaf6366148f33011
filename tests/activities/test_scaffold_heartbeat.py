"""`ScaffoldContext.heartbeat` in production: the scaffold activity's `_LiveBeat` turns a
scaffold's heartbeat into a Temporal activity heartbeat (temporalio's ActivityEnvironment
records them) carrying the latest details, and never raises into the scaffold outside one."""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from activities.scaffold import _LiveBeat
from workflows.shared import ScaffoldHeartbeat


async def test_scaffold_heartbeats_become_activity_heartbeats():
    env = ActivityEnvironment()
    seen: list = []
    env.on_heartbeat = lambda *details: seen.append(details)
    live = _LiveBeat(attempt=2, proxy=None, session_id=None)

    async def scaffold_running() -> ScaffoldHeartbeat:
        live.from_scaffold({"scaffold": "x", "turn": 1})
        live.from_scaffold({"scaffold": "x", "turn": 2})
        return live.beat()

    after = await env.run(scaffold_running)
    assert [d[0].scaffold for d in seen] == [{"scaffold": "x", "turn": 1}, {"scaffold": "x", "turn": 2}]
    assert all(isinstance(d[0], ScaffoldHeartbeat) and d[0].attempt == 2 for d in seen)
    assert after.scaffold == {"scaffold": "x", "turn": 2}  # the periodic beat repeats the latest


def test_a_heartbeat_outside_an_activity_is_dropped_not_raised():
    live = _LiveBeat(attempt=1, proxy=None, session_id=None)
    live.from_scaffold({"turn": 1})  # no activity context: logged at debug, no exception
    assert live.beat().scaffold == {"turn": 1}
