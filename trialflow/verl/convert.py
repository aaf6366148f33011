"""Trial trajectory -> the fields of verl's ``AgentLoopOutput`` (pure: no verl, no I/O).

``convert_trial(trajectory, result, config)`` returns a `ConvertedTrial`: one `primary`
sample (what a verl agent loop returns) plus `extras` (other segments, when configured).
`LoopSample.output_fields()` is the keyword set for ``AgentLoopOutput(**fields)``.

Which segment is trained on
- primary: the first ``main`` segment that is not ``rewritten`` (the conversation as the
  scaffold started it); if every main segment is rewritten, the first main segment.
- ``rewritten`` main segments (the scaffold rewrote its history, e.g. compaction, so the
  proxy opened a new sequence) and ``side`` segments (sub-agents, title/summary calls)
  are each a complete, token-exact sequence of their own. `ConvertConfig.rewritten` and
  `ConvertConfig.side` say per kind: ``"extra"`` (default: an extra sample with the
  trial's reward, so every token the policy generated trains) or ``"drop"``. verl's
  classic ``AgentLoopWorker`` takes ONE output per sample, so extras only reach training
  through verl's v1 (TransferQueue) worker, which accepts a list (the agent loop returns
  ``[*extras, primary]``: verl scores the last); the agent loop refuses ``extra`` under
  the classic trainer at start-up (`trialflow.verl.agent_loop`).
- no main segment at all (e.g. the ``oracle``/``nop`` scaffolds never call the model, or
  the scaffold died before its first turn): the primary is a one-token placeholder
  (``filler_token_id``) with an all-zero mask, flagged ``empty``.

Lengths (verl pads to ``rollout.prompt_length`` / ``rollout.response_length`` and fails
on longer inputs)
- a prompt longer than ``prompt_length`` keeps its first ``prompt_length`` tokens as the
  prompt and moves the rest to the head of the response as environment tokens (mask 0,
  logprob 0.0). The model input (prompt + response) is unchanged, so logprobs and
  routed experts stay aligned; only the response budget shrinks (``prompt_spill``).
- a response longer than the budget is cut (``overlong``); masks, logprobs and experts
  are cut with it, and the sample is masked out (``masked_by="cut"``): the trial's reward
  belongs to the whole response, never to a cut prefix. (The proxy session enforces the
  same budget, so a trial normally ends ``overlong`` before anything needs cutting.)

Rewards and masks
- ``reward_score`` is the verifier's reward when ``result.reward_valid``, else
  ``invalid_reward``. With ``mask_invalid`` (default) an invalid trial (infra error,
  verifier error, cancelled) also gets an all-zero ``response_mask`` so that a broken
  environment never looks like a model failure to the policy gradient. Masking the member
  is not enough for group estimators (GRPO's mean/std would still count its
  ``invalid_reward``): `trialflow.verl.groups` masks the whole group around it.
- ``overlong_filter`` (DAPO's overlong filtering): a trial that ended ``overlong`` (it hit
  the token budget) is masked out too (``masked_by="overlong_filter"``); off by default,
  when such a trial is graded on what it did.

Token accounting (`LoopSample.policy_tokens`, `ConvertedTrial.dropped`): every token the
policy generated is either in a sample's ``response_mask`` or counted under the cause
that kept it out (``segment_dropped``, ``cut``, ``invalid``, ``overlong_filter``; the
group policy adds ``invalid_group``); `trialflow.verl.signal` folds these into verl's
step metrics.

Routed experts (R3)
- the trajectory keeps ``[len(prompt) + len(response), layers, top_k]`` per segment with a
  sentinel (255 for uint8, -1 for int16) where the routing is unknown (the last token, turns
  without a report). verl wants the same row layout starting at the first prompt token,
  rows it does not know as 0. So: rows cut to the kept tokens, sentinels -> 0.
- ``experts_shape`` None: experts are never emitted (verl then has no ``routed_experts``).
  Set to ``(layers, top_k)``: every sample carries experts (zeros where the trajectory has
  none), because verl concatenates the field across the batch and cannot mix with None.
  A trajectory whose experts have another shape raises `ConversionError`.

Multi-step tasks (``result.step_results``; docs/harbor.md): every step ran as its own agent,
so each step's trajectory is a sequence of its own (no step's tokens were in another's
context). `convert_trial` takes them as ``steps`` (in step order, None for a step without
one): the primary is the first step's primary segment (or the next step's, when a step has
none); every other step's primary segment is a sample of kind ``step`` under
`ConvertConfig.steps` (``"extra"`` default, ``"drop"``); side/rewritten segments of every
step follow their own policies. Every sample carries the trial's combined reward (Harbor's
`multi_step_reward_strategy`): verl's v1 worker gives every output of one agent-loop run
the last output's reward (``agent_loop_tq.py``, ``_agent_loop_postprocess``), so a step's
own reward cannot reach verl as that step's score; ``extra_fields`` name the sample's step
and every step's reward.

Policy versions: ``min_global_steps`` / ``max_global_steps`` (verl's own extra-field keys,
used for staleness filtering) come from the segment's ``policy_version_min/max``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from proxy.trajectory import Segment, Trajectory, experts_sentinel
from workflows.shared import TrialResult

SegmentPolicy = Literal["drop", "extra"]
# Why policy tokens did not reach the loss (see the module docstring).
MaskCause = Literal["cut", "invalid", "overlong_filter", "invalid_group"]


class ConversionError(ValueError):
    """The trajectory cannot be expressed as verl samples under this configuration."""


@dataclass(frozen=True)
class ConvertConfig:
    """How trajectories become samples. Lengths are verl's ``rollout.prompt_length`` and
    ``rollout.response_length``; both must be >= 1."""

    prompt_length: int
    response_length: int
    filler_token_id: int = 0
    with_logprobs: bool = True
    experts_shape: tuple[int, int] | None = None
    side: SegmentPolicy = "extra"
    rewritten: SegmentPolicy = "extra"
    steps: SegmentPolicy = "extra"  # a multi-step task's later steps' primary segments
    invalid_reward: float = 0.0
    mask_invalid: bool = True
    overlong_filter: bool = False  # mask trials that ended at the token budget (DAPO)

    def __post_init__(self) -> None:
        if self.prompt_length < 1 or self.response_length < 1:
            raise ConversionError(f"lengths must be >= 1, got {self.prompt_length}/{self.response_length}")


@dataclass
class LoopSample:
    """One training sample: the token fields of ``AgentLoopOutput`` and what happened to it."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float] | None
    routed_experts: np.ndarray | None
    segment: int | None  # index in the trajectory; None for the empty placeholder
    kind: str  # "main" | "side" | "rewritten" | "step" | "empty"
    overlong: bool = False  # the response was cut to the budget
    prompt_spill: int = 0  # prompt tokens moved into the response head
    policy_version_min: int | None = None
    policy_version_max: int | None = None
    step: str | None = None  # a multi-step task's step the segment belongs to
    policy_tokens: int = 0  # tokens the policy generated in this sample's segment
    masked_by: MaskCause | None = None  # why the whole response is masked out, if it is

    @property
    def trained_tokens(self) -> int:
        """Policy tokens of this sample that reach the loss (mask 1)."""
        return sum(self.response_mask)

    def mask_out(self, cause: MaskCause) -> None:
        """Mask the whole response (first cause wins: it is the one that decided)."""
        self.response_mask = [0] * len(self.response_mask)
        if self.masked_by is None:
            self.masked_by = cause

    def output_fields(self) -> dict[str, Any]:
        """Keyword arguments for ``AgentLoopOutput`` (token fields only)."""
        return {
            "prompt_ids": self.prompt_ids,
            "response_ids": self.response_ids,
            "response_mask": self.response_mask,
            "response_logprobs": self.response_logprobs,
            "routed_experts": self.routed_experts,
        }


@dataclass
class ConvertedTrial:
    primary: LoopSample
    extras: list[LoopSample] = field(default_factory=list)
    reward_score: float = 0.0
    masked: bool = False  # the whole trial was masked out (invalid reward)
    # policy tokens of segments that became no sample (their policy is "drop"), by kind
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def samples(self) -> list[LoopSample]:
        """Extras first, primary last (verl's v1 worker scores the last output)."""
        return [*self.extras, self.primary]


def convert_trial(
    trajectory: Trajectory | None,
    result: TrialResult,
    config: ConvertConfig,
    steps: Sequence[Trajectory | None] | None = None,
) -> ConvertedTrial:
    """Turn one trial into samples (see the module docstring for every rule). A multi-step
    trial's trajectories come as ``steps`` (one per `result.step_results` entry); then
    ``trajectory`` is not used."""
    valid = result.reward_valid
    reward = float(result.reward) if valid else config.invalid_reward
    cause: MaskCause | None = None
    if config.mask_invalid and not valid:
        cause = "invalid"
    elif config.overlong_filter and result.termination_reason == "overlong":
        cause = "overlong_filter"
    if steps is not None and result.step_results:
        names: list[str | None] = [s.name for s in result.step_results]
        parts = list(zip(names, steps, strict=True))
    else:
        parts = [(None, trajectory)]
    primary: LoopSample | None = None
    extras = []
    dropped: dict[str, int] = {}
    for step, traj in parts:
        segments = traj.segments if traj is not None else []
        main = _primary_index(segments)
        for i, seg in enumerate(segments):
            if i == main and primary is None:
                primary = _sample(seg, i, "main", config, cause, step)
                continue
            kind = "step" if i == main else "side" if seg.kind == "side" else "rewritten"
            policy = {"step": config.steps, "side": config.side, "rewritten": config.rewritten}[kind]
            if policy == "extra":
                extras.append(_sample(seg, i, kind, config, cause, step))
            else:
                dropped[kind] = dropped.get(kind, 0) + sum(seg.response_mask)
    return ConvertedTrial(
        primary=primary or _empty_sample(config),
        extras=extras,
        reward_score=reward,
        masked=cause == "invalid",
        dropped=dropped,
    )


def _primary_index(segments: list[Segment]) -> int | None:
    mains = [i for i, s in enumerate(segments) if s.kind == "main"]
    if not mains:
        return None
    original = [i for i in mains if not segments[i].rewritten]
    return (original or mains)[0]


def _sample(
    seg: Segment, index: int, kind: str, config: ConvertConfig, cause: MaskCause | None, step: str | None
) -> LoopSample:
    # The segment holds typed arrays (proxy.trajectory); verl's AgentLoopOutput wants lists.
    prompt = seg.prompt_ids.tolist()
    response = seg.response_ids.tolist()
    mask = seg.response_mask.tolist()
    logprobs = seg.response_logprobs.tolist()
    if not (len(response) == len(mask) == len(logprobs)):
        raise ConversionError(
            f"segment {index}: {len(response)} response ids, {len(mask)} mask, {len(logprobs)} logprobs"
        )
    spill = max(0, len(prompt) - config.prompt_length)
    if spill:
        moved = prompt[config.prompt_length :]
        prompt = prompt[: config.prompt_length]
        response = moved + response
        mask = [0] * spill + mask
        logprobs = [0.0] * spill + logprobs
    overlong = len(response) > config.response_length
    response = response[: config.response_length]
    mask = mask[: config.response_length]
    logprobs = logprobs[: config.response_length]
    experts = _experts(seg, index, len(prompt) + len(response), config)
    sample = LoopSample(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs if config.with_logprobs else None,
        routed_experts=experts,
        segment=index,
        kind=kind,
        overlong=overlong,
        prompt_spill=spill,
        policy_version_min=seg.policy_version_min,
        policy_version_max=seg.policy_version_max,
        step=step,
        policy_tokens=sum(seg.response_mask),
    )
    if cause is not None:
        sample.mask_out(cause)
    elif overlong:
        sample.mask_out("cut")
    return sample


def _experts(seg: Segment, index: int, n_tokens: int, config: ConvertConfig) -> np.ndarray | None:
    if config.experts_shape is None:
        return None
    shape = (n_tokens, *config.experts_shape)
    src = seg.routed_experts
    if src is None:
        return np.zeros(shape, dtype=np.int16)
    if tuple(src.shape[1:]) != tuple(config.experts_shape):
        raise ConversionError(
            f"segment {index}: routed experts {tuple(src.shape[1:])}, configured {tuple(config.experts_shape)}"
        )
    # verl casts to int16 and reads 0 as "unknown"; our sentinel (255 / -1) would be read
    # as a real expert id, so it is rewritten before handing the rows over.
    rows = src[:n_tokens].astype(np.int16)
    rows[src[:n_tokens] == experts_sentinel(src.dtype)] = 0
    if len(rows) < n_tokens:  # never expected (the trajectory covers every token); pad as unknown
        rows = np.concatenate([rows, np.zeros((n_tokens - len(rows), *config.experts_shape), dtype=np.int16)])
    return rows


def _empty_sample(config: ConvertConfig) -> LoopSample:
    experts = None if config.experts_shape is None else np.zeros((2, *config.experts_shape), dtype=np.int16)
    return LoopSample(
        prompt_ids=[config.filler_token_id],
        response_ids=[config.filler_token_id],
        response_mask=[0],
        response_logprobs=[0.0] if config.with_logprobs else None,
        routed_experts=experts,
        segment=None,
        kind="empty",
    )


def loop_metrics(
    trajectory: Trajectory | None, result: TrialResult, steps: Sequence[Trajectory | None] = ()
) -> dict[str, float | int]:
    """Values for verl's ``AgentLoopMetrics`` (a multi-step trial: over its ``steps``).

    generate_sequences: seconds the proxy spent generating (sum of turn latencies);
    tool_calls: the rest of the scaffold phase (agent + tools + sandbox), never negative;
    compute_score: the verifier phase; num_preempted: weight-sync aborts that were resumed.
    """
    trajectories = [t for t in (*steps, trajectory) if t is not None]
    generate = sum(turn.latency_s for t in trajectories for turn in t.turns)
    scaffold = float(result.timings.get("scaffold", 0.0))
    return {
        "generate_sequences": float(generate),
        "tool_calls": max(0.0, scaffold - generate),
        "compute_score": float(result.timings.get("verify", 0.0)),
        "num_preempted": sum(t.counters.aborts_resumed for t in trajectories),
    }


def extra_fields(converted: ConvertedTrial, sample: LoopSample, result: TrialResult) -> dict[str, Any]:
    """``AgentLoopOutput.extra_fields`` for one sample of a trial.

    verl turns every key into a per-sample column (None where a sample lacks it), so every
    sample gets the same keys. ``turn_scores``/``tool_rewards`` are verl's own defaults.
    """
    return {
        "trial_id": result.trial_id,
        "workflow_id": result.trial_id,
        "termination_reason": result.termination_reason,
        "reward_valid": result.reward_valid,
        "rewards": dict(result.rewards),
        "trajectory_uri": _trajectory_uri(sample, result),
        "result_uri": result.result_uri,
        "trial_error": result.error.type if result.error is not None else None,
        "trial_timings": dict(result.timings),
        # New segments forced by the scaffold's rewrites vs by the chat template (the latter
        # should be 0 for a family the proxy extends; see docs/verl.md on what "drop" discards)
        "rewrites_client": result.rewrites_client,
        "rewrites_template": result.rewrites_template,
        "segment": sample.segment,
        "segment_kind": sample.kind,
        "masked": sample.masked_by is not None or sample.kind == "empty",
        "masked_by": sample.masked_by,
        "policy_tokens": sample.policy_tokens,
        "trained_tokens": sample.trained_tokens,
        # policy tokens of segments this trial gave no sample (kind -> tokens); the primary
        # carries them so that a step's sum counts every trial once
        "dropped_tokens": dict(converted.dropped) if sample is converted.primary else {},
        "overlong": sample.overlong,
        "prompt_spill": sample.prompt_spill,
        # a multi-step trial: the sample's step and each step's reward (None: invalid)
        "step": sample.step,
        "step_rewards": {s.name: s.reward if s.reward_valid else None for s in result.step_results},
        "min_global_steps": sample.policy_version_min,
        "max_global_steps": sample.policy_version_max,
        "turn_scores": [],
        "tool_rewards": [],
        # verl's v1 worker copies the last output's reward_extra_info onto every other
        # output of the run (agent_loop_tq.py) and fails without it; the reward is ours
        "reward_extra_info": {},
    }


def _trajectory_uri(sample: LoopSample, result: TrialResult) -> str | None:
    """Where the sample's tokens are stored: its step's trajectory, else the last attempt's."""
    if sample.step is not None:
        return next((s.trajectory_uri for s in result.step_results if s.name == sample.step), None)
    return result.last_attempt.uri if result.last_attempt else None
