"""Bench: how long the trainer waits beyond the trials themselves, and trajectory bytes/token.

Part 1 (needs Temporal + S3 + Docker): N trials (default 64, scaffold ``oracle`` or ``nop``)
through `run_step` with an in-process worker, then conversion to verl ``AgentLoopOutput``s.
Reports the trials' own durations (workflow start -> close, from Temporal) and the gather
latency: last workflow close (server clock) -> batch converted in the trainer (same host
clock), plus the client-side view (last result -> batch ready).

Part 3 (needs S3): reading N stored trajectories of a 30-turn, 18.7k-token conversation
back and converting them (what the trainer does after the last trial), dense and MoE.

Part 2 (pure): bytes per token of the stored trajectory (npz, compressed) for a multi-turn
conversation, with and without routed experts, at a dense size and an MoE size.

    (S3 keys from TRIALFLOW_S3_ACCESS_KEY / TRIALFLOW_S3_SECRET_KEY, as `trialflow up` prints them)
    python bench/verl_gather.py --temporal 127.0.0.1:17233 --s3 http://127.0.0.1:18333 --trials 64
    python bench/verl_gather.py --only-bytes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np

from proxy.trajectory import SegmentHeader, Trajectory, TurnDelta, TurnRecord

REPO = Path(__file__).resolve().parents[1]


def synthetic_trajectory(
    turns: int, gen: int, env: int, prompt: int, experts: tuple[int, int, int] | None, seed: int = 0
) -> Trajectory:
    """A one-segment conversation through the real fold: random ids (vocab 150k), logprobs
    from a log-normal, experts uniformly random over (layers, top_k, n_experts)."""
    rng = np.random.default_rng(seed)
    traj = Trajectory(session_id="bench")
    length = prompt
    for t in range(turns):
        env_ids = [] if t == 0 else rng.integers(0, 150_000, env).tolist()
        gen_ids = rng.integers(0, 150_000, gen).tolist()
        length += len(env_ids) + gen
        routed = None
        if experts is not None:
            layers, top_k, n_exp = experts
            routed = rng.integers(0, n_exp, (length - 1, layers, top_k), dtype=np.int32)
        traj.apply(
            TurnDelta(
                record=TurnRecord(
                    segment=0,
                    prompt_tokens=length - gen,
                    completion_tokens=gen,
                    env_tokens_added=len(env_ids),
                    finish_reason="stop",
                    policy_version=1,
                ),
                gen_ids=gen_ids,
                gen_logprobs=(-rng.lognormal(-1.5, 1.2, gen)).tolist(),
                env_ids=env_ids,
                new_segment=SegmentHeader("main", False, "sys", rng.integers(0, 150_000, prompt).tolist())
                if t == 0
                else None,
                routed_experts=routed,
            )
        )
    return traj


def bytes_per_token() -> list[dict]:
    rows = []
    shapes = {"none": None, "moe-48x8/128 (Qwen3-30B-A3B)": (48, 8, 128), "moe-2x2/8 (tiny)": (2, 2, 8)}
    for name, shape in shapes.items():
        traj = synthetic_trajectory(turns=30, gen=200, env=300, prompt=4000, experts=shape)
        size = len(traj.to_bytes())
        tokens = len(traj.segments[0])
        rows.append(
            {"experts": name, "tokens": tokens, "bytes": size, "bytes_per_token": round(size / tokens, 2)}
        )
    return rows


async def gather_bench(args: argparse.Namespace) -> dict:
    import docker

    from trialflow import batch
    from trialflow.cli._worker import WorkerProcess
    from trialflow.sandbox.base_image import ensure_base_image
    from trialflow.settings import load_settings
    from trialflow.storage import open_store
    from trialflow.verl.convert import ConvertConfig, convert_trial
    from trialflow.verl.step_batch import run_step

    ensure_base_image(docker.from_env())
    suffix = uuid.uuid4().hex[:8]
    settings = load_settings(
        temporal_address=args.temporal,
        task_queue=f"bench-{suffix}",
        s3_endpoint=args.s3,
        s3_bucket="trialflow-bench",
        s3_prefix=f"bench-{suffix}",
        worker_id=f"bench-{suffix}",
        max_concurrent_trials=args.concurrency,
        drain_grace_s=5,
    )
    client = await batch.connect(settings.temporal_address)
    async with WorkerProcess(settings, client):
        specs = batch.make_specs(
            f"bench-{suffix}",
            [REPO / "examples" / "tasks" / args.task],
            args.scaffold,
            samples=args.trials,
            attempt_limit=1,
        )
        t0 = time.time()
        step = await run_step(client, open_store(settings), specs, task_queue=settings.task_queue)
        cfg = ConvertConfig(prompt_length=4096, response_length=8192)
        converted = [convert_trial(t.trajectory, t.result, cfg) for t in step.trials]
        in_hands = time.time()
        descs = await asyncio.gather(*(client.get_workflow_handle(s.trial_id).describe() for s in specs))
    closes = [d.close_time.timestamp() for d in descs]
    durations = [(d.close_time - d.start_time).total_seconds() for d in descs]
    own = [sum(t.result.timings.values()) for t in step.trials]
    if args.report:
        from trialflow.report import write_report

        write_report(
            args.report, [t.result for t in step.trials], title=f"bench {args.trials} x {args.scaffold}"
        )
    return {
        "trials": len(specs),
        "scaffold": args.scaffold,
        "task": args.task,
        "worker_slots": args.concurrency,
        "converted": len(converted),
        "rewards_valid": sum(t.result.reward_valid for t in step.trials),
        "step_wall_s": round(in_hands - t0, 2),
        "terminations": dict(Counter(t.result.termination_reason for t in step.trials)),
        "errors": dict(
            Counter(
                f"{t.result.error.type}: {t.result.error.message[:80]}" for t in step.trials if t.result.error
            )
        ),
        "reward_errors": dict(
            Counter(t.result.reward_error[:80] for t in step.trials if t.result.reward_error)
        ),
        "workflow_s_median": round(statistics.median(durations), 2),
        "workflow_s_max": round(max(durations), 2),
        "phases_s_median": round(statistics.median(own), 2),
        "gather_s_server_close_to_in_hands": round(in_hands - max(closes), 3),
        "gather_s_client_last_result_to_ready": round(step.gather_s, 3),
    }


async def read_bench(args: argparse.Namespace) -> list[dict]:
    from trialflow.settings import load_settings
    from trialflow.storage import AttemptRecord, open_store
    from trialflow.verl.convert import ConvertConfig, convert_trial
    from trialflow.verl.step_batch import load_trajectory
    from workflows.shared import TrialResult

    settings = load_settings(
        s3_endpoint=args.s3,
        s3_bucket="trialflow-bench",
        s3_prefix=f"read-{uuid.uuid4().hex[:8]}",
    )
    store = open_store(settings)
    rows = []
    for name, shape in {"none": None, "moe-48x8/128": (48, 8, 128)}.items():
        payload = synthetic_trajectory(turns=30, gen=200, env=300, prompt=4000, experts=shape).to_bytes()
        results = []
        for i in range(args.trials):
            uri = store.put_bytes(f"{name.replace('/', '_')}/{i}/trajectory.npz", payload)
            results.append(
                TrialResult(
                    trial_id=f"t{i}",
                    batch_id="b",
                    task_name="t",
                    scaffold="s",
                    sample_index=i,
                    reward=1.0,
                    reward_valid=True,
                    termination_reason="submitted",
                    attempt_records=[
                        AttemptRecord(attempt=1, checkpoints_uri="unused/", trajectory_uri=uri, complete=True)
                    ],
                )
            )
        cfg = ConvertConfig(
            prompt_length=8192, response_length=16384, experts_shape=None if shape is None else shape[:2]
        )
        t0 = time.perf_counter()
        loaded = await asyncio.gather(*(load_trajectory(store, r) for r in results))
        t1 = time.perf_counter()
        for one, r in zip(loaded, results, strict=True):
            assert one is not None and one.error is None, one
            convert_trial(one.trajectory, r, cfg)
        t2 = time.perf_counter()
        rows.append(
            {
                "experts": name,
                "trajectories": args.trials,
                "bytes_each": len(payload),
                "read_s": round(t1 - t0, 2),
                "convert_s": round(t2 - t1, 2),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--temporal", default="127.0.0.1:17233")
    ap.add_argument("--s3", default="http://127.0.0.1:18333")
    ap.add_argument("--trials", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--scaffold", default="oracle")
    ap.add_argument("--task", default="create-file")
    ap.add_argument("--only-bytes", action="store_true")
    ap.add_argument("--report", help="also write the batch's HTML report here")
    args = ap.parse_args()
    out = {"bytes_per_token": bytes_per_token()}
    if not args.only_bytes:
        out["gather"] = asyncio.run(gather_bench(args))
        out["read_convert"] = asyncio.run(read_bench(args))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
