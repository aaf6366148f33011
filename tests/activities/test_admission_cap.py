"""The live-sandbox cap through the REAL stack (Temporal dev server, Docker, SeaweedFS).

A worker with ``max_concurrent_trials=2`` gets 8 trials whose agent sleeps 3 s: before the
cap, set-ups ran 2 at a time but every finished set-up left its sandbox alive, so all 8 were
alive at once (this test against that worker: 8) and their scaffolds waited on the 4 host
slots, where a wait over the host schedule-to-start timeout (5 s here) is a lost host. Now the engine,
sampled throughout, never holds more than 2 of this worker's sandboxes, and every trial
finishes in its first attempt: the trials beyond the cap waited as set-up tasks in
Temporal's queue.

The worker runs the adaptive controller (starting at one sandbox, a tick every 0.5 s) under
that ceiling; afterwards its metrics and `trialflow status` show its limits and what binds them.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from tests._wait import wait_until
from tests._worker_fixtures import worker_settings
from trialflow import batch
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult, register_scaffold
from trialflow.settings import TrialflowSettings

REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "examples" / "tasks" / "create-file"
CAP, TRIALS, AGENT_S = 2, 8, 3

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]
_batches: set[str] = set()  # the batches this module ran (status lists one)


class SlowScaffold(Scaffold):
    """Test scaffold: an agent that works for AGENT_S seconds inside its sandbox."""

    name = "test-slow"
    needs_model = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        res = await ctx.sandbox.exec(f"sleep {AGENT_S}", timeout_s=60)
        return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)


register_scaffold("test-slow", f"{__name__}:SlowScaffold")


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client) -> TrialflowSettings:
    return worker_settings(
        "admission",
        temporal_address,
        s3_endpoint,
        docker_client,
        max_concurrent_trials=CAP,
        admission="adaptive",
        admission_start=1,
        admission_interval_s=0.5,
    )


async def _watch_engine(docker_client, label: str, seen: list[int], stop: asyncio.Event) -> None:
    """Sample how many of this worker's sandboxes the engine holds (any state)."""
    while not stop.is_set():
        containers = await asyncio.to_thread(
            docker_client.containers.list,
            all=True,
            sparse=True,
            filters={"label": f"trialflow.worker={label}"},
        )
        seen.append(len(containers))
        await asyncio.sleep(0.1)


async def test_live_sandboxes_never_exceed_the_cap_and_no_attempt_is_lost(
    client, settings, worker, docker_client, no_leaked_sandboxes
):
    batch_id = f"cap-{uuid.uuid4().hex[:6]}"
    _batches.add(batch_id)
    specs = batch.make_specs(
        batch_id,
        [TASK],
        "test-slow",
        samples=TRIALS,
        attempt_limit=2,
        host_schedule_timeout_s=5,  # a trial queued on a busy host would be "lost" at once
    )
    seen: list[int] = []
    stop = asyncio.Event()
    watcher = asyncio.create_task(_watch_engine(docker_client, worker.host_queue, seen, stop))
    try:
        results = await batch.run(client, specs, task_queue=settings.task_queue)
    finally:
        stop.set()
        await watcher
    assert len(seen) > 20  # the batch ran long enough for the sampling to mean something
    assert max(seen) <= CAP, f"engine held {max(seen)} sandboxes of this worker (cap {CAP})"
    assert max(seen) == CAP  # and the cap was reached: trials did run side by side
    assert [(r.attempts, r.error, r.termination_reason) for r in results] == [(1, None, "submitted")] * TRIALS
    assert worker.admission.live == 0 and worker.admission.sandboxes.held <= CAP  # idle pollers' slots
    # max(seen) == CAP: the controller, started at 1, grew to the ceiling while its gate was
    # full of work; idle now, its limit is back near what is used (at most 2 x 0, at least 1)
    await wait_until(
        lambda: worker.metrics.value("trialflow_admission_limit", {"kind": "sandboxes"}) == 1,
        what="the idle controller's limit back at 1",
    )


async def test_status_shows_each_workers_admission(settings, worker):
    from typer.testing import CliRunner

    from trialflow.cli import app

    env = {
        "TRIALFLOW_TEMPORAL_ADDRESS": settings.temporal_address,
        "TRIALFLOW_S3_ENDPOINT": settings.s3_endpoint,
        "TRIALFLOW_S3_BUCKET": settings.s3_bucket,
        "TRIALFLOW_S3_PREFIX": settings.s3_prefix,
        "TRIALFLOW_S3_ACCESS_KEY": settings.s3_access_key or "",
        "TRIALFLOW_S3_SECRET_KEY": settings.s3_secret_key or "",
        "COLUMNS": "250",
    }
    batch_id = next(iter(_batches))

    def status_row() -> str | None:
        out = CliRunner().invoke(app, ["status", batch_id], env=env, catch_exceptions=False).output
        assert batch_id in out, out  # the trials' table is still there
        return next((line for line in out.splitlines() if settings.worker_id in line), None)

    row = None
    for _ in range(60):  # the worker writes its report every tick (0.5 s); idle, it settles at 1
        row = await asyncio.to_thread(status_row)  # the worker runs on this test's loop
        if row is not None and "0/1" in row:
            break
        await asyncio.sleep(0.5)
    assert row is not None
    assert "adaptive" in row and "0/1" in row and "demand:idle" in row, row
