"""Builders for real `Trajectory` objects (through the proxy's own fold) and `TrialResult`s."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from proxy.trajectory import SegmentHeader, Trajectory, TurnDelta, TurnRecord
from workflows.shared import TrialResult

LAYERS, TOP_K = 2, 2


@dataclass
class Turn:
    gen: list[int]
    env: list[int] = field(default_factory=list)
    version: int | None = None
    experts: bool = False
    finish: str = "stop"


def add_segment(traj: Trajectory, prompt: list[int], turns: list[Turn], *, kind: str = "main",
                rewritten: bool = False, expert_base: int = 0) -> int:
    """Append a segment with `turns` (the first opens it) through `Trajectory.apply`."""
    index = len(traj.segments)
    length = len(prompt)
    for t, turn in enumerate(turns):
        new = t == 0
        assert not (new and turn.env), "a new segment's first turn has no env tokens"
        length += len(turn.env) + len(turn.gen)
        experts = None
        if turn.experts:
            rows = np.arange((length - 1) * LAYERS * TOP_K, dtype=np.int32) % 7 + expert_base
            experts = rows.reshape(length - 1, LAYERS, TOP_K)
        traj.apply(TurnDelta(
            record=TurnRecord(segment=index, prompt_tokens=length - len(turn.gen),
                              completion_tokens=len(turn.gen), env_tokens_added=len(turn.env),
                              finish_reason=turn.finish, latency_s=0.25),
            gen_ids=turn.gen,
            gen_logprobs=[-0.5 - 0.01 * i for i in range(len(turn.gen))],
            env_ids=turn.env,
            new_segment=SegmentHeader(kind=kind, rewritten=rewritten, system_key="sys", prompt_ids=prompt)
            if new else None,
            routed_experts=experts,
            policy_version=turn.version,
        ))
    return index


def roundtrip(traj: Trajectory) -> Trajectory:
    """What a reader of the store gets back."""
    return Trajectory.from_bytes(traj.to_bytes())


def result(reward: float = 1.0, valid: bool = True, termination: str = "submitted", **kw) -> TrialResult:
    base = dict(trial_id="trial-b-t-0", batch_id="b", task_name="t", scaffold="oracle", sample_index=0,
                reward=reward, reward_valid=valid, termination_reason=termination,
                timings={"setup": 1.0, "scaffold": 3.0, "verify": 0.5},
                trajectory_uris=["s3://bucket/trials/trial-b-t-0/attempt-1/trajectory.npz"])
    base.update(kw)
    return TrialResult(**base)
