"""Trials per minute and peak memory at N concurrent ``oracle`` trials on one host.

For each concurrency N in ``--concurrency``: a worker (``trialflow.cli._worker.WorkerProcess``, in this
process, ``max_concurrent_trials=N``) on a Temporal dev server started here, and N trials
of ``--task`` (default ``create-file``) with the ``oracle`` scaffold (runs the task's
``solution/solve.sh``) submitted at once through ``trialflow.batch.run``. Each level uses
a fresh batch id; the task image is built once before the first level.

Reported per level: wall seconds from submit to the last result, trials per minute
(N / wall * 60), how many trials got reward 1, per-trial workflow-side phase medians,
and peak memory sampled every ``--sample-s``:

- worker RSS: this process (the worker and the tiny client that submits; the client's
  share is small) — ``VmRSS`` of ``/proc/self/status``;
- containers: the sum of ``memory.usage_in_bytes`` of the bench's containers (cgroup v1,
  ``/sys/fs/cgroup/memory/docker/<id>/``; includes page cache) — containers are found by
  this worker's label through the Docker API;
- the Temporal dev server's RSS (it is a separate process started here).

CPU: machine-wide busy CPU seconds during the level (``/proc/stat``) against wall x cores,
and CPU seconds by process name (``/proc/*/stat``, including reaped children), which shows
what the cores were doing (dockerd, containerd-shim/runc, the worker, Temporal, and other
users' processes on a shared machine). For trials that failed on an activity heartbeat
timeout, the workflow history gives the activity's start-to-timeout seconds and the last
heartbeat the server held (none: the activity never heartbeated).

A level that does not finish within ``--level-timeout-s`` is reported as such, with how
many trials had finished; its workflows are then terminated.

    .venv/bin/python bench/throughput.py [--concurrency 8 32 128] [--task create-file]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from orchestration import temporal_worker  # noqa: E402 - after the sys.path line

CGROUP = Path("/sys/fs/cgroup/memory/docker")


def rss_of(pid: int | str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        return 0
    return 0


def containers_bytes(dclient, queue: str) -> int:
    total = 0
    for c in dclient.containers.list(filters={"label": f"trialflow.worker={queue}"}):
        try:
            total += int((CGROUP / c.id / "memory.usage_in_bytes").read_text())
        except (FileNotFoundError, ValueError):
            pass
    return total


def cpu_by_process(own: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user + system, plus reaped children's) of every process, summed by
    command name; pids in ``own`` are reported under their given name instead. A process
    that exited is counted only if a living parent reaped it (its time is then the
    parent's ``cutime``), e.g. ``runc`` under ``containerd-shim``."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        name = own.get(int(d.name)) or stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + sum(int(x) for x in fields[11:15]) / tick
    return out


def machine_busy_s() -> float:
    """CPU seconds all cores spent not idle since boot (/proc/stat)."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]  # idle + iowait
    return (sum(parts[:8]) - idle) / os.sysconf("SC_CLK_TCK")


async def sample_peaks(dclient, queue: str, temporal_pid: int | None, every_s: float, peaks: dict) -> None:
    while True:
        worker = rss_of("self")
        boxes = await asyncio.to_thread(containers_bytes, dclient, queue)
        temporal = rss_of(temporal_pid) if temporal_pid else 0
        for k, v in (
            ("worker_rss", worker),
            ("containers", boxes),
            ("temporal_rss", temporal),
            ("total", worker + boxes + temporal),
        ):
            peaks[k] = max(peaks.get(k, 0), v)
        peaks["max_running_containers"] = max(
            peaks.get("max_running_containers", 0),
            len(
                await asyncio.to_thread(
                    dclient.containers.list, filters={"label": f"trialflow.worker={queue}"}
                )
            ),
        )
        await asyncio.sleep(every_s)


async def heartbeat_timeouts(client, trial_ids: list[str]) -> list[dict]:
    """For each workflow, every activity that timed out on heartbeat: seconds from its start
    to the timeout and the last heartbeat details the server had (empty: it never got one)."""
    out = []
    for wid in trial_ids:
        started: dict[int, float] = {}
        async for e in client.get_workflow_handle(wid).fetch_history_events():
            if e.HasField("activity_task_started_event_attributes"):
                started[e.event_id] = e.event_time.ToDatetime().timestamp()
            if e.HasField("activity_task_timed_out_event_attributes"):
                attrs = e.activity_task_timed_out_event_attributes
                details = attrs.failure.timeout_failure_info.last_heartbeat_details.payloads
                t0 = started.get(attrs.started_event_id)
                out.append(
                    {
                        "trial": wid[-24:],
                        "started_to_timeout_s": round(e.event_time.ToDatetime().timestamp() - t0, 1)
                        if t0
                        else None,
                        "last_heartbeat": [p.data.decode(errors="replace")[:120] for p in details],
                    }
                )
    return out


async def level(client, settings, process, dclient, n: int, args: argparse.Namespace, temporal_pid) -> dict:
    from temporalio.service import RPCError

    from trialflow import batch

    batch_id = f"tput{n}-{uuid.uuid4().hex[:6]}"
    specs = batch.make_specs(
        batch_id, [REPO / "examples" / "tasks" / args.task], "oracle", samples=n, attempt_limit=1
    )
    peaks: dict = {}
    sampler = asyncio.create_task(
        sample_peaks(dclient, process.host_queue, temporal_pid, args.sample_s, peaks)
    )
    done: list = []
    own = {os.getpid(): "bench worker (this process)"}
    if temporal_pid:
        own[temporal_pid] = "temporal dev server (bench)"
    cpu0, busy0 = cpu_by_process(own), machine_busy_s()
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    timed_out = False
    try:
        await asyncio.wait_for(
            batch.run(client, specs, on_result=done.append, task_queue=settings.task_queue),
            args.level_timeout_s,
        )
    except TimeoutError:
        timed_out = True
        for spec in specs:
            try:
                await client.get_workflow_handle(spec.trial_id).terminate("bench level timed out")
            except RPCError as exc:  # typically: already closed
                print(f"terminate {spec.trial_id}: {exc}", file=sys.stderr)
    wall = time.perf_counter() - t0
    sampler.cancel()
    cpu1, busy1 = cpu_by_process(own), machine_busy_s()
    spent = {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
    top = sorted(((k, v) for k, v in spent.items() if v > 0), key=lambda kv: -kv[1])[: args.top_processes]
    phases: dict[str, list[float]] = {}
    for r in done:
        for k, v in r.timings.items():
            phases.setdefault(k, []).append(v)
    mib = 1024**2
    stuck = [r.trial_id for r in done if r.error and "HEARTBEAT" in r.error.type]
    return {
        "concurrency": n,
        "finished": len(done),
        "timed_out": timed_out,
        "wall_s": round(wall, 1),
        "trials_per_minute": round(len(done) / wall * 60, 1),
        "reward_1": sum(1 for r in done if r.reward_valid and r.reward == 1.0),
        "terminations": dict(Counter(r.termination_reason for r in done)),
        "errors": dict(
            Counter(f"{r.error.phase}: {r.error.type}: {r.error.message[:100]}" for r in done if r.error)
        ),
        "phase_medians_s": {k: round(statistics.median(v), 2) for k, v in phases.items()},
        "peak_mib": {k: (round(v / mib) if k != "max_running_containers" else v) for k, v in peaks.items()},
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "machine_cpu_busy_s": round(busy1 - busy0, 1),
        "machine_cpu_available_s": round(wall * os.cpu_count(), 1),
        "cpu_s_by_process": {k: round(v, 1) for k, v in top},
        "heartbeat_timeouts": await heartbeat_timeouts(client, stuck),
    }


async def bench(args: argparse.Namespace) -> dict:
    import docker

    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.base_image import ensure_base_image
    from trialflow.tasks import load_task

    dclient = docker.from_env()
    await asyncio.to_thread(ensure_base_image, dclient)
    # Build the task image once, outside every level's clock.
    await DockerBackend(dclient).ensure_image(load_task(REPO / "examples" / "tasks" / args.task))
    levels = []
    with tempfile.TemporaryDirectory(prefix="tf-bench-tput-") as state:
        for n in args.concurrency:
            async with temporal_worker(Path(state) / str(n), max_trials=n, address=args.temporal) as (
                client,
                settings,
                process,
            ):
                temporal_pid = None
                if args.temporal is None:
                    temporal_pid = temporal_server_pid(Path(state) / str(n) / "temporal")
                row = await level(client, settings, process, dclient, n, args, temporal_pid)
            levels.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return {"task": args.task, "scaffold": "oracle", "levels": levels}


def temporal_server_pid(state_dir: Path) -> int | None:
    """The dev server process whose command line names this state dir (we started it)."""
    needle = str(state_dir / "temporal.sqlite").encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes():
                    return int(d.name)
            except OSError:
                continue
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--task", default="create-file")
    ap.add_argument("--sample-s", type=float, default=1.0)
    ap.add_argument("--level-timeout-s", type=float, default=900)
    ap.add_argument("--top-processes", type=int, default=10, help="processes to list by CPU seconds")
    ap.add_argument("--temporal", help="use this Temporal frontend (host:port) instead of starting one")
    args = ap.parse_args()
    started = time.time()
    result = asyncio.run(bench(args))
    print(
        json.dumps(
            {
                "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
                "wall_s": round(time.time() - started, 1),
                "cpus": os.cpu_count(),
                **result,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
