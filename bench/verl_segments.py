"""Bench: conversion cost of multi-segment trajectories for verl, against one segment, same run.

1,000 trials of a 14-turn conversation (40 generated + 60 tool-output tokens per turn, a
400-token first prompt), as verl receives them: `convert_trial` -> `extra_fields` (one
sample per segment, the v1 batch expansion) -> the group policy over the step
(`groups_to_mask`, groups of 8) -> `step_metrics`. Shapes, all through the proxy's fold:

- ``single``: one segment of 14 turns (the baseline);
- ``compaction``: 8 turns, then a rewritten segment of 6 (its prompt re-rendered: a
  summary of 300 tokens);
- ``every_turn``: a scaffold that rewrites its history every turn: 14 segments, each a
  fresh render of the whole history so far.

Reports seconds per 1,000 trials and per 1M tokens handed to verl (prompt + response of
every sample: a rewritten segment's prompt is a fresh render, so a scaffold that rewrites
every turn hands verl the history 14 times), with the ratios to ``single`` measured in the
same run (median of --repeat runs). Most of the time is copying token arrays into the
Python lists ``AgentLoopOutput`` takes, so the cost follows the tokens verl receives.

    .venv/bin/python bench/verl_segments.py --trials 1000 --repeat 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from proxy.trajectory import SegmentHeader, Trajectory, TurnDelta, TurnRecord
from trialflow.storage import AttemptRecord
from trialflow.verl.convert import ConvertConfig, convert_trial, extra_fields
from trialflow.verl.groups import groups_to_mask
from trialflow.verl.signal import step_metrics
from workflows.shared import TrialResult

GEN, ENV, FIRST, TURNS = 40, 60, 400, 14


def _segment(traj: Trajectory, prompt: list[int], turns: int, rng, rewritten: bool) -> None:
    index, length = len(traj.segments), len(prompt)
    for t in range(turns):
        env = [] if t == 0 else rng.integers(0, 150_000, ENV).tolist()
        gen = rng.integers(0, 150_000, GEN).tolist()
        length += len(env) + GEN
        traj.apply(
            TurnDelta(
                record=TurnRecord(
                    segment=index,
                    prompt_tokens=length - GEN,
                    completion_tokens=GEN,
                    env_tokens_added=len(env),
                    finish_reason="stop",
                    latency_s=0.1,
                    policy_version=3,
                ),
                gen_ids=gen,
                gen_logprobs=(-rng.lognormal(size=GEN)).tolist(),
                env_ids=env,
                new_segment=SegmentHeader(kind="main", rewritten=rewritten, system_key="s", prompt_ids=prompt)
                if t == 0
                else None,
            )
        )


def build(shape: str, seed: int) -> Trajectory:
    rng = np.random.default_rng(seed)
    traj = Trajectory(session_id=f"{shape}-{seed}")
    first = rng.integers(0, 150_000, FIRST).tolist()
    if shape == "single":
        _segment(traj, first, TURNS, rng, False)
    elif shape == "compaction":
        _segment(traj, first, 8, rng, False)
        _segment(traj, first + rng.integers(0, 150_000, 300).tolist(), 6, rng, True)
    else:  # every_turn: each turn a fresh render of the whole history so far
        for t in range(TURNS):
            _segment(traj, first + rng.integers(0, 150_000, t * (GEN + ENV)).tolist(), 1, rng, t > 0)
    return Trajectory.from_bytes(traj.to_bytes())  # what the trainer reads back


def result(i: int) -> TrialResult:
    return TrialResult(
        trial_id=f"trial-{i}",
        batch_id="b",
        task_name="t",
        scaffold="bench",
        sample_index=i,
        reward=float(i % 2),
        reward_valid=i % 97 != 0,  # a few invalid trials: their groups get masked
        termination_reason="submitted",
        attempt_records=[
            AttemptRecord(attempt=1, checkpoints_uri="s3://b/c/", trajectory_uri="s3://b/t.npz")
        ],
    )


def run(trajs: list[Trajectory], results: list[TrialResult], cfg: ConvertConfig) -> tuple[float, int]:
    """Seconds for the step, and the tokens handed to verl (prompt + response of every sample)."""
    t0 = time.perf_counter()
    rows = []
    for traj, res in zip(trajs, results, strict=True):
        conv = convert_trial(traj, res, cfg)
        for s in conv.samples:
            rows.append((res.trial_id, s, extra_fields(conv, s, res)))
    spoiled = groups_to_mask(
        [int(r[0].split("-")[1]) // 8 for r in rows], [r[2]["reward_valid"] for r in rows]
    )
    for (_, sample, fields), bad in zip(rows, spoiled, strict=True):
        if bad:
            sample.mask_out("invalid_group")
            fields["masked_by"], fields["trained_tokens"] = sample.masked_by, 0
    step_metrics(r[2] for r in rows)
    dt = time.perf_counter() - t0
    return dt, sum(len(s.prompt_ids) + len(s.response_ids) for _, s, _ in rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    cfg = ConvertConfig(prompt_length=4096, response_length=4096)
    results = [result(i) for i in range(args.trials)]
    distinct = 20  # built once each, reused across trials (building is not what is measured)
    shapes = {s: [build(s, i) for i in range(distinct)] for s in ("single", "compaction", "every_turn")}
    timing: dict[str, list[float]] = {s: [] for s in shapes}
    tokens: dict[str, int] = {}
    for _ in range(args.repeat):
        for shape, pool in shapes.items():  # interleaved: load from other work hits all alike
            trajs = [pool[i % distinct] for i in range(args.trials)]
            dt, trained = run(trajs, results, cfg)
            timing[shape].append(dt)
            tokens[shape] = trained
    base = statistics.median(timing["single"])
    print(
        f"{'shape':<12} {'samples/trial':>13} {'s / 1k trials':>14} {'ratio':>6} {'s / 1M tokens':>14} {'ratio':>6}"
    )
    base_tok = base / tokens["single"] * 1e6
    for shape, ts in timing.items():
        med = statistics.median(ts)
        per_1k = med / args.trials * 1000
        per_tok = med / tokens[shape] * 1e6
        segs = len(shapes[shape][0].segments)
        print(
            f"{shape:<12} {segs:>13} {per_1k:>14.3f} {med / base:>6.2f} {per_tok:>14.3f} {per_tok / base_tok:>6.2f}"
        )


if __name__ == "__main__":
    main()
