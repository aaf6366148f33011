"""Time Temporal adds per trial: the real TrialWorkflow vs the same steps called directly.

Same run, same Docker engine, same task (``create-file``), scaffold ``nop`` (does nothing,
so the trial is pure orchestration + sandbox + verifier):

- ``direct``: ``DockerBackend.create`` + ``start`` -> ``nop`` scaffold run -> ``run_verifier``
  -> ``stop``, called in this process with no Temporal at all;
- ``temporal``: ``trialflow.batch.run`` of one ``TrialSpec`` on a Temporal dev server
  (started here on free ports, SQLite state in a temp dir) with an in-process worker built
  by ``trialflow.cli._worker.WorkerProcess`` (store: ``LocalStore`` in a temp dir, no model replicas); timed
  from submit to the result in hand, so it includes workflow/activity task dispatch, the
  result store and log uploads the workflow does.

Trials run one at a time, alternating direct/temporal, after one warm-up of each (the
task image is built on the first one). Reported: median/min/max seconds per trial per
mode, the added seconds (median temporal - median direct) and the per-phase medians the
workflow itself records (``TrialResult.timings``: each activity's own duration, measured
inside the activity) next to the same phases of the direct path, so the added time can be
split into "activities do more work" (log uploads, attach, task reload) and "dispatch
between activities" (the rest).

    .venv/bin/python bench/orchestration.py [--trials 10] [--task create-file] [--scaffold nop]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


@contextlib.asynccontextmanager
async def temporal_worker(
    state: Path, *, max_trials: int, address: str | None = None
) -> AsyncIterator[tuple]:
    """A Temporal dev server (unless ``address`` is given) and an in-process worker.
    Yields ``(client, settings, worker_process)``."""
    from infra.services import start_temporal
    from trialflow import batch
    from trialflow.cli._worker import WorkerProcess
    from trialflow.settings import load_settings

    service = None
    if address is None:
        service = await asyncio.to_thread(start_temporal, state / "temporal", headless=True)
        address = service.endpoint
    suffix = uuid.uuid4().hex[:8]
    settings = load_settings(
        temporal_address=address,
        task_queue=f"bench-{suffix}",
        store_dir=state / "store",
        worker_id=f"bench-{suffix}",
        max_concurrent_trials=max_trials,
        drain_grace_s=5,
    )
    client = await batch.connect(settings.temporal_address)
    try:
        async with WorkerProcess(settings, client) as process:
            yield client, settings, process
    finally:
        if service is not None:
            await asyncio.to_thread(service.stop)


async def direct_trial(backend, task, scaffold_name: str) -> tuple[float, dict[str, float], float]:
    """Create, start, run the scaffold, verify, stop. Returns (seconds, phase seconds, reward);
    the phases are cut where the workflow's activities are (setup, scaffold, verify, teardown)."""
    from trialflow.scaffolds import ScaffoldContext, get_scaffold
    from trialflow.verifier import run_verifier

    scaffold = get_scaffold(scaffold_name)
    marks = [time.perf_counter()]
    sandbox = await backend.create(
        task, trial_id=f"direct-{uuid.uuid4().hex[:8]}", labels={}, mounts=list(scaffold.mounts())
    )
    try:
        await sandbox.start()
        marks.append(time.perf_counter())
        with tempfile.TemporaryDirectory(prefix="tf-bench-") as tmp:
            await scaffold.run(ScaffoldContext(sandbox=sandbox, task=task, timeout_s=600, log_dir=Path(tmp)))
        marks.append(time.perf_counter())
        result = await run_verifier(sandbox, task)
        marks.append(time.perf_counter())
    finally:
        await sandbox.stop()
    marks.append(time.perf_counter())
    phases = dict(
        zip(
            ("setup", "scaffold", "verify", "teardown"),
            (b - a for a, b in itertools.pairwise(marks)),
            strict=False,
        )
    )
    return marks[-1] - marks[0], phases, result.reward


async def temporal_trial(client, settings, batch_id: str, task_path: Path, scaffold: str, index: int):
    from trialflow import batch

    spec = batch.make_specs(batch_id, [task_path], scaffold, samples=index + 1, attempt_limit=1)[index]
    t0 = time.perf_counter()
    [result] = await batch.run(client, [spec], task_queue=settings.task_queue)
    return time.perf_counter() - t0, result


def stats(xs: list[float]) -> dict:
    return {
        "median_s": round(statistics.median(xs), 3),
        "min_s": round(min(xs), 3),
        "max_s": round(max(xs), 3),
        "n": len(xs),
    }


async def bench(args: argparse.Namespace) -> dict:
    import docker

    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.base_image import ensure_base_image
    from trialflow.tasks import load_task

    task_path = REPO / "examples" / "tasks" / args.task
    task = load_task(task_path)
    dclient = docker.from_env()
    await asyncio.to_thread(ensure_base_image, dclient)
    backend = DockerBackend(dclient, labels={"trialflow.bench": "orchestration"})
    batch_id = f"orch-{uuid.uuid4().hex[:6]}"
    direct: list[float] = []
    temporal: list[float] = []
    phases: dict[str, list[float]] = {}
    direct_phases: dict[str, list[float]] = {}
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tf-bench-orch-") as state:
        async with temporal_worker(Path(state), max_trials=2, address=args.temporal) as (client, settings, _):
            await direct_trial(backend, task, args.scaffold)  # warm-up: builds the task image
            await temporal_trial(client, settings, batch_id, task_path, args.scaffold, 0)
            for i in range(1, args.trials + 1):
                secs, parts, _ = await direct_trial(backend, task, args.scaffold)
                direct.append(secs)
                for k, v in parts.items():
                    direct_phases.setdefault(k, []).append(v)
                secs, result = await temporal_trial(client, settings, batch_id, task_path, args.scaffold, i)
                temporal.append(secs)
                if result.error is not None or not result.reward_valid:
                    problems.append(f"{result.termination_reason}: {result.error or result.reward_error}")
                for k, v in result.timings.items():
                    phases.setdefault(k, []).append(v)
    d, t = stats(direct), stats(temporal)
    return {
        "task": args.task,
        "scaffold": args.scaffold,
        "direct": d,
        "temporal": t,
        "added_s_median": round(t["median_s"] - d["median_s"], 3),
        "ratio_median": round(t["median_s"] / d["median_s"], 3),
        "direct_phase_medians_s": {k: round(statistics.median(v), 3) for k, v in direct_phases.items()},
        "temporal_phase_medians_s": {k: round(statistics.median(v), 3) for k, v in phases.items()},
        "problems": problems,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--task", default="create-file")
    ap.add_argument("--scaffold", default="nop")
    ap.add_argument("--temporal", help="use this Temporal frontend (host:port) instead of starting one")
    args = ap.parse_args()
    load_before = os.getloadavg()
    started = time.time()
    result = asyncio.run(bench(args))
    print(
        json.dumps(
            {
                "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
                "wall_s": round(time.time() - started, 1),
                "cpus": os.cpu_count(),
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                **result,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
