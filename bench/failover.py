"""Time from a host's loss to its trials' next attempts elsewhere (issue 23), same run.

Real Temporal dev server, SeaweedFS and Docker (started here unless given), two
``python worker_main.py`` hosts on one engine. ``--trials`` slow oracle-like trials
(``tests.test_worker_crash:SlowSolveScaffold``: ``sleep --solve-s`` in the sandbox, then the answer) are
submitted while only the first host runs, so all of them start there; then the second host
starts, and the first is frozen (SIGSTOP: no heartbeats, polls or lease renewals, as a cut
link) until every trial has ended, then thawed.

Per lost trial, from its Temporal history: ``detect_s`` (freeze -> its activity's heartbeat
timeout fired), ``failover_s`` (freeze -> the next attempt's set-up *started* on the healthy
host) and ``after_detect_s`` (heartbeat timeout -> that set-up started). The baseline is the
heartbeat timeout itself (the earliest a silent host can be told from a slow one);
``failover_over_heartbeat_s`` = failover - heartbeat timeout, target <= 10 s (before fencing:
54-123 s after detection, issue 23).

    .venv/bin/python bench/failover.py [--trials 3] [--heartbeat-s 10] [--solve-s 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests._worker_fixtures import start_worker_process  # noqa: E402


async def _trial_times(handle, frozen_at: float) -> dict:
    """The loss and the next set-up of one trial, from its history (wall-clock seconds)."""
    history = await handle.fetch_history()
    lost = next(e for e in history.events if e.HasField("activity_task_timed_out_event_attributes"))
    scheduled = {}
    setup2_started = None
    for e in history.events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            scheduled[e.event_id] = e
        if e.HasField("activity_task_started_event_attributes") and e.event_id > lost.event_id:
            sched = scheduled[e.activity_task_started_event_attributes.scheduled_event_id]
            if sched.activity_task_scheduled_event_attributes.activity_type.name == "trial.setup":
                setup2_started = e
                break
    assert setup2_started is not None, "no next set-up"
    lost_t = lost.event_time.ToDatetime().timestamp()
    started_t = setup2_started.event_time.ToDatetime().timestamp()
    return {
        "detect_s": round(lost_t - frozen_at, 2),
        "failover_s": round(started_t - frozen_at, 2),
        "after_detect_s": round(started_t - lost_t, 2),
    }


async def bench(args: argparse.Namespace) -> dict:
    import docker

    from infra.services import S3Credentials, create_bucket, start_seaweedfs, start_temporal
    from trialflow import batch
    from trialflow.sandbox.base_image import ensure_base_image

    await asyncio.to_thread(ensure_base_image, docker.from_env())
    suffix = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="tf-bench-failover-") as state_dir:
        state = Path(state_dir)
        services = []
        try:
            temporal = await asyncio.to_thread(start_temporal, state / "temporal", headless=True)
            services.append(temporal)
            s3 = await asyncio.to_thread(
                start_seaweedfs, state / "seaweedfs", credentials=S3Credentials.generate()
            )
            services.append(s3)
            bucket = f"bench-{suffix}"
            create_bucket(s3.endpoint, bucket, s3.credentials)
            queue = f"failover-{suffix}"
            env = {
                **os.environ,
                "PYTHONPATH": str(REPO),
                "TRIALFLOW_TEST_SOLVE_S": str(args.solve_s),
                "TRIALFLOW_TEMPORAL_ADDRESS": temporal.endpoint,
                "TRIALFLOW_TASK_QUEUE": queue,
                "TRIALFLOW_S3_ENDPOINT": s3.endpoint,
                "TRIALFLOW_S3_BUCKET": bucket,
                "TRIALFLOW_S3_ACCESS_KEY": s3.credentials.access_key,
                "TRIALFLOW_S3_SECRET_KEY": s3.credentials.secret_key,
                "TRIALFLOW_EXTRA_SCAFFOLDS": json.dumps(
                    {"test-slow-solve": "tests.test_worker_crash:SlowSolveScaffold"}
                ),
                "TRIALFLOW_MAX_CONCURRENT_TRIALS": str(args.trials),
                "TRIALFLOW_HOST_LEASE_S": str(2 * args.heartbeat_s),
                "TRIALFLOW_DRAIN_GRACE_S": "10",
            }
            client = await batch.connect(temporal.endpoint)
            first = start_worker_process(env, f"first-{suffix}", state / "first.log")
            second = None
            try:
                specs = batch.make_specs(
                    f"failover-{suffix}",
                    [REPO / "examples" / "tasks" / "create-file"],
                    "test-slow-solve",
                    samples=args.trials,
                    check=False,
                    heartbeat_timeout_s=args.heartbeat_s,
                    host_schedule_timeout_s=120,
                )
                handles = await batch.submit(client, specs, task_queue=queue)
                from workflows.trial import TrialWorkflow

                deadline = time.monotonic() + 300
                while True:  # every trial in its scaffold on the first host
                    phases = [(await h.query(TrialWorkflow.progress)).phase for h in handles]
                    if all(p == "scaffold" for p in phases):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"trials never reached their scaffolds: {phases}")
                    await asyncio.sleep(0.5)
                second = start_worker_process(env, f"second-{suffix}", state / "second.log")
                await asyncio.sleep(5)  # it polls
                first.send_signal(signal.SIGSTOP)
                frozen_at = time.time()
                results = await asyncio.wait_for(
                    asyncio.gather(*(batch.wait_one(h, s) for h, s in zip(handles, specs, strict=True))),
                    timeout=600,
                )
                first.send_signal(signal.SIGCONT)
                times = [await _trial_times(h, frozen_at) for h in handles]
                problems = [
                    f"{r.trial_id}: {r.termination_reason} {r.error}" for r in results if r.reward != 1.0
                ]
                fenced = [r.attempt_records[0].fenced for r in results]
            finally:
                for proc in (first, second):
                    if proc is not None:
                        proc.send_signal(signal.SIGCONT)
                        proc.send_signal(signal.SIGTERM)
                for proc in (first, second):
                    if proc is not None:
                        try:
                            proc.wait(60)
                        except subprocess.TimeoutExpired:
                            proc.kill()
        finally:
            for service in reversed(services):
                await asyncio.to_thread(service.stop)
    failover = [t["failover_s"] for t in times]
    return {
        "trials": args.trials,
        "heartbeat_timeout_s": args.heartbeat_s,
        "per_trial": times,
        "failover_median_s": round(statistics.median(failover), 2),
        "failover_max_s": round(max(failover), 2),
        "failover_over_heartbeat_max_s": round(max(failover) - args.heartbeat_s, 2),
        "target_over_heartbeat_s": 10,
        "all_fenced": all(fenced),
        "problems": problems,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--heartbeat-s", type=float, default=10.0)
    ap.add_argument("--solve-s", type=float, default=20.0)
    args = ap.parse_args()
    started = time.time()
    load_before = os.getloadavg()
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
