"""convert_trial: real trajectories (built by the proxy's fold, round-tripped through npz)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.trajectory import Trajectory
from tests._hypothesis import examples
from tests.verl._support import LAYERS, TOP_K, Turn, add_segment, result, roundtrip
from trialflow.verl.convert import ConversionError, ConvertConfig, convert_trial, extra_fields, loop_metrics

PROMPT = list(range(100, 110))
DROP = {"side": "drop", "rewritten": "drop", "steps": "drop"}  # the first segment only


def _two_turns(experts: bool = False) -> Trajectory:
    traj = Trajectory(session_id="s")
    add_segment(
        traj,
        PROMPT,
        [
            Turn(gen=[1, 2, 3], version=4, experts=experts),
            Turn(gen=[4, 5], env=[50, 51, 52, 53], version=5, experts=experts),
        ],
    )
    return roundtrip(traj)


def test_main_segment_is_copied_token_exact():
    traj = _two_turns()
    out = convert_trial(traj, result(reward=0.75), ConvertConfig(prompt_length=32, response_length=32))
    p = out.primary
    assert p.prompt_ids == PROMPT
    assert p.response_ids == [1, 2, 3, 50, 51, 52, 53, 4, 5]
    assert p.response_mask == [1, 1, 1, 0, 0, 0, 0, 1, 1]
    seg = traj.segments[0]
    assert p.response_logprobs == seg.response_logprobs.tolist()
    assert p.response_logprobs[3:7] == [0.0] * 4
    assert (p.policy_version_min, p.policy_version_max) == (4, 5)
    assert not p.overlong and p.prompt_spill == 0 and p.kind == "main" and p.segment == 0
    assert out.reward_score == 0.75 and not out.masked
    assert out.extras == [] and out.samples == [p]


def test_truncation_sets_overlong_and_cuts_everything_alike():
    traj = _two_turns(experts=True)
    out = convert_trial(
        traj, result(), ConvertConfig(prompt_length=32, response_length=5, experts_shape=(LAYERS, TOP_K))
    )
    p = out.primary
    assert p.overlong
    assert p.response_ids == [1, 2, 3, 50, 51]
    assert len(p.response_mask) == len(p.response_logprobs) == 5
    # the trial's reward belongs to the whole response: a cut prefix is never trained with it
    assert p.response_mask == [0] * 5 and p.masked_by == "cut" and p.policy_tokens == 5
    assert extra_fields(out, p, result())["trained_tokens"] == 0
    assert p.routed_experts.shape == (len(PROMPT) + 5, LAYERS, TOP_K)
    np.testing.assert_array_equal(p.routed_experts, traj.segments[0].routed_experts[: len(PROMPT) + 5])


def test_exact_budget_is_not_overlong():
    out = convert_trial(_two_turns(), result(), ConvertConfig(prompt_length=10, response_length=9))
    assert not out.primary.overlong and out.primary.prompt_spill == 0


def test_long_prompt_spills_into_response_as_environment_tokens():
    traj = _two_turns()
    out = convert_trial(traj, result(), ConvertConfig(prompt_length=6, response_length=32))
    p = out.primary
    assert p.prompt_spill == 4
    assert p.prompt_ids == PROMPT[:6]
    assert p.prompt_ids + p.response_ids == traj.segments[0].full_ids  # the model input is unchanged
    assert p.response_mask[:4] == [0] * 4 and p.response_logprobs[:4] == [0.0] * 4
    assert p.response_mask[4:] == traj.segments[0].response_mask.tolist()


def test_spill_then_cut_keeps_the_sequence_a_prefix():
    traj = _two_turns(experts=True)
    cfg = ConvertConfig(prompt_length=8, response_length=4, experts_shape=(LAYERS, TOP_K))
    p = convert_trial(traj, result(), cfg).primary
    assert p.prompt_spill == 2 and p.overlong
    assert p.prompt_ids + p.response_ids == traj.segments[0].full_ids[:12]
    assert len(p.routed_experts) == 12


def test_experts_sentinels_become_zero_and_dtype_is_int16():
    traj = _two_turns(experts=True)
    seg = traj.segments[0]
    assert seg.routed_experts.dtype == np.uint8 and (seg.routed_experts[-1] == 255).all()
    p = convert_trial(
        traj, result(), ConvertConfig(prompt_length=32, response_length=32, experts_shape=(LAYERS, TOP_K))
    ).primary
    assert p.routed_experts.dtype == np.int16
    assert (p.routed_experts[-1] == 0).all()
    np.testing.assert_array_equal(p.routed_experts[:-1], seg.routed_experts[:-1].astype(np.int16))


def test_int16_experts_keep_large_ids():
    traj = Trajectory(session_id="s")
    add_segment(traj, PROMPT, [Turn(gen=[1, 2], experts=True)], expert_base=300)
    traj = roundtrip(traj)
    assert traj.segments[0].routed_experts.dtype == np.int16
    p = convert_trial(
        traj, result(), ConvertConfig(prompt_length=32, response_length=32, experts_shape=(LAYERS, TOP_K))
    ).primary
    assert p.routed_experts[:-1].min() >= 300 and (p.routed_experts[-1] == 0).all()


def test_experts_absent_are_zero_filled_when_configured_and_omitted_otherwise():
    traj = _two_turns(experts=False)
    p = convert_trial(
        traj, result(), ConvertConfig(prompt_length=32, response_length=32, experts_shape=(LAYERS, TOP_K))
    ).primary
    assert p.routed_experts.shape == (len(PROMPT) + 9, LAYERS, TOP_K) and not p.routed_experts.any()
    with_experts = _two_turns(experts=True)
    q = convert_trial(with_experts, result(), ConvertConfig(prompt_length=32, response_length=32)).primary
    assert q.routed_experts is None


def test_experts_shape_mismatch_is_a_typed_error():
    with pytest.raises(ConversionError, match="routed experts"):
        convert_trial(_two_turns(experts=True), result(), ConvertConfig(32, 32, experts_shape=(3, 2)))


def test_no_trajectory_gives_masked_placeholder():
    out = convert_trial(
        None, result(reward=1.0), ConvertConfig(32, 32, filler_token_id=7, experts_shape=(LAYERS, TOP_K))
    )
    p = out.primary
    assert p.kind == "empty" and p.segment is None
    assert p.prompt_ids == [7] and p.response_ids == [7] and p.response_mask == [0]
    assert p.routed_experts.shape == (2, LAYERS, TOP_K)
    assert out.reward_score == 1.0  # the verifier's verdict still counts (oracle trials)
    assert extra_fields(out, p, result())["masked"] is True


def test_side_segments_only_primary_is_placeholder_and_sides_are_extras():
    traj = Trajectory(session_id="s")
    add_segment(traj, [9, 9, 9], [Turn(gen=[1])], kind="side")
    traj = roundtrip(traj)
    out = convert_trial(traj, result(), ConvertConfig(32, 32, side="extra"))
    assert out.primary.kind == "empty"
    assert [s.kind for s in out.extras] == ["side"] and out.extras[0].prompt_ids == [9, 9, 9]
    assert convert_trial(traj, result(), ConvertConfig(32, 32, **DROP)).extras == []
    assert convert_trial(traj, result(), ConvertConfig(32, 32)).extras[0].kind == "side"  # default: trains


def test_rewritten_and_side_segments_by_policy_and_order():
    traj = Trajectory(session_id="s")
    add_segment(traj, [8, 8], [Turn(gen=[1])], kind="side")
    add_segment(traj, PROMPT, [Turn(gen=[2, 3])])
    add_segment(traj, [5, 5, 5], [Turn(gen=[4])], rewritten=True)
    traj = roundtrip(traj)
    cfg = ConvertConfig(32, 32, side="extra", rewritten="extra")
    out = convert_trial(traj, result(reward=0.5), cfg)
    assert out.primary.segment == 1 and out.primary.kind == "main"
    assert [(s.segment, s.kind) for s in out.extras] == [(0, "side"), (2, "rewritten")]
    assert out.samples[-1] is out.primary
    only_rewritten = convert_trial(traj, result(), ConvertConfig(32, 32, **{**DROP, "rewritten": "extra"}))
    assert [s.kind for s in only_rewritten.extras] == ["rewritten"]
    assert only_rewritten.dropped == {"side": 1}  # the side segment's one policy token
    none = convert_trial(traj, result(), ConvertConfig(32, 32, **DROP))
    assert none.extras == [] and none.dropped == {"side": 1, "rewritten": 1}


def test_all_main_segments_rewritten_primary_is_the_first():
    traj = Trajectory(session_id="s")
    add_segment(traj, [1, 1], [Turn(gen=[2])], rewritten=True)
    add_segment(traj, [3, 3], [Turn(gen=[4])], rewritten=True)
    out = convert_trial(roundtrip(traj), result(), ConvertConfig(32, 32, rewritten="extra"))
    assert out.primary.segment == 0 and [s.segment for s in out.extras] == [1]


@pytest.mark.parametrize("termination", ["infra_error", "verifier_error", "cancelled"])
def test_invalid_reward_masks_the_trial(termination):
    out = convert_trial(
        _two_turns(),
        result(reward=1.0, valid=False, termination=termination),
        ConvertConfig(32, 32, invalid_reward=-1.0),
    )
    assert out.masked and out.reward_score == -1.0
    assert out.primary.response_mask == [0] * len(out.primary.response_ids)
    unmasked = convert_trial(_two_turns(), result(valid=False), ConvertConfig(32, 32, mask_invalid=False))
    assert not unmasked.masked and 1 in unmasked.primary.response_mask


def test_without_logprobs():
    assert (
        convert_trial(
            _two_turns(), result(), ConvertConfig(32, 32, with_logprobs=False)
        ).primary.response_logprobs
        is None
    )


def test_bad_lengths_rejected():
    with pytest.raises(ConversionError):
        ConvertConfig(prompt_length=0, response_length=4)


def test_metrics_and_extra_fields():
    traj = _two_turns()
    res = result(reward=1.0)
    m = loop_metrics(traj, res)
    assert m == {"generate_sequences": 0.5, "tool_calls": 2.5, "compute_score": 0.5, "num_preempted": 0}
    out = convert_trial(traj, res, ConvertConfig(32, 32))
    ef = extra_fields(out, out.primary, res)
    assert ef["trial_id"] == "trial-b-t-0" and ef["termination_reason"] == "submitted"
    assert ef["trajectory_uri"].endswith("attempt-1/trajectory.npz")
    assert (ef["min_global_steps"], ef["max_global_steps"]) == (4, 5)
    assert ef["reward_valid"] is True and ef["masked"] is False
    assert loop_metrics(None, res)["generate_sequences"] == 0.0


@settings(max_examples=examples(60), deadline=None)
@given(
    prompt_len=st.integers(1, 12),
    turns=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 4)), min_size=1, max_size=4),
    p_budget=st.integers(1, 14),
    r_budget=st.integers(1, 20),
    experts=st.booleans(),
)
def test_invariants(prompt_len, turns, p_budget, r_budget, experts):
    traj = Trajectory(session_id="s")
    spec = [
        Turn(gen=list(range(1, g + 1)), env=[] if i == 0 else [60] * e, experts=experts)
        for i, (g, e) in enumerate(turns)
    ]
    add_segment(traj, list(range(200, 200 + prompt_len)), spec)
    traj = roundtrip(traj)
    cfg = ConvertConfig(p_budget, r_budget, experts_shape=(LAYERS, TOP_K))
    p = convert_trial(traj, result(), cfg).primary
    full = traj.segments[0].full_ids
    assert len(p.prompt_ids) <= p_budget and len(p.response_ids) <= r_budget
    assert len(p.response_ids) == len(p.response_mask) == len(p.response_logprobs)
    assert p.prompt_ids + p.response_ids == full[: len(p.prompt_ids) + len(p.response_ids)]
    assert p.overlong == (len(full) - len(p.prompt_ids) > r_budget)
    assert len(p.routed_experts) == len(p.prompt_ids) + len(p.response_ids)
    assert p.routed_experts.min() >= 0
    # every model token kept is still marked as the model's (unless cut: then none is),
    # spilled prompt tokens never are
    assert sum(p.response_mask[: p.prompt_spill]) == 0
    assert p.trained_tokens == (0 if p.overlong else p.policy_tokens)


def _steps_result(**kw):
    from workflows.shared import StepResult

    steps = [
        StepResult(
            name="one",
            reward=1.0,
            reward_valid=True,
            trajectory_uri="s3://b/attempt-1/steps/1-one/trajectory.npz",
        ),
        StepResult(name="two", reward_valid=False),  # model-free or lost: no trajectory
        StepResult(
            name="three",
            reward=0.5,
            reward_valid=True,
            trajectory_uri="s3://b/attempt-1/steps/3-three/trajectory.npz",
        ),
    ]
    return result(reward=0.75, step_results=steps, **kw)


def _step_trajectory(prompt: list[int], gen: list[int], side: bool = False) -> Trajectory:
    traj = Trajectory(session_id="s")
    if side:
        add_segment(traj, [7, 7], [Turn(gen=[8])], kind="side")
    add_segment(traj, prompt, [Turn(gen=gen, version=4)])
    return roundtrip(traj)


def test_multi_step_trial_primary_is_the_first_step_and_later_steps_by_policy():
    res = _steps_result()
    steps = [_step_trajectory([1, 1], [2, 3]), None, _step_trajectory([4, 4, 4], [5], side=True)]
    out = convert_trial(None, res, ConvertConfig(32, 32, **DROP), steps)
    assert (out.primary.prompt_ids, out.primary.response_ids, out.primary.step) == ([1, 1], [2, 3], "one")
    assert out.extras == [] and out.reward_score == 0.75  # the trial's combined reward
    every = convert_trial(None, res, ConvertConfig(32, 32), steps)  # default: every segment trains
    assert [(s.kind, s.step, s.prompt_ids) for s in every.samples] == [
        ("side", "three", [7, 7]),
        ("step", "three", [4, 4, 4]),
        ("main", "one", [1, 1]),
    ]
    ef = extra_fields(every, every.extras[1], res)
    assert ef["step"] == "three" and ef["trajectory_uri"].endswith("steps/3-three/trajectory.npz")
    assert ef["step_rewards"] == {"one": 1.0, "two": None, "three": 0.5}
    assert extra_fields(every, every.primary, res)["trajectory_uri"].endswith("steps/1-one/trajectory.npz")
    # the first step that has a main segment is the primary
    later = convert_trial(None, res, ConvertConfig(32, 32), [None, None, steps[2]])
    assert (later.primary.step, later.primary.prompt_ids) == ("three", [4, 4, 4])
    assert convert_trial(None, res, ConvertConfig(32, 32), [None, None, None]).primary.kind == "empty"
    m = loop_metrics(None, res, steps)
    assert m["generate_sequences"] == pytest.approx(0.75)  # the 3 turns of both steps (0.25 s each)
