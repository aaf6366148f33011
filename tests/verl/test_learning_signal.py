"""What the trainer learns from: every policy token trained with the reward it earned, no
false zero. Trajectories are built by the proxy's own fold and round-tripped through the
stored npz; each goes through `TemporalAgentLoop`'s own output path, then verl 0.9.1's
REAL per-sample and batch post-processing (``AgentLoopWorker._agent_loop_postprocess`` /
``_postprocess``: what each v1 output also becomes, one row each) and verl's real
advantage estimators (``ray_trainer.compute_advantage``: GRPO, Dr.GRPO, RLOO)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from proxy.trajectory import Trajectory
from tests.verl._support import (
    Turn,
    add_segment,
    bare_worker,
    instantiate_loop,
    result,
    roundtrip,
    verl_batch,
)
from trialflow.verl.agent_loop import (
    TemporalAgentLoop,
    TemporalAgentLoopManager,
    UnsupportedTrainer,
    apply_group_mask,
    check_trainer,
)
from trialflow.verl.groups import GroupGate, groups_to_mask
from trialflow.verl.signal import step_metrics
from trialflow.verl.step_batch import StepTrial
from workflows.shared import StepResult, TrialSpec

P_LEN, R_LEN = 64, 256


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def loop(tokenizer, tiny_model_dir):
    return instantiate_loop(tokenizer, tiny_model_dir, P_LEN, R_LEN, replicas=["http://127.0.0.1:1"])


def _turns(n: int, first_gen: int = 100) -> list[Turn]:
    """n agent turns: 5 generated tokens each, 3 tool-output tokens between turns."""
    return [
        Turn(gen=[first_gen + 5 * i + k for k in range(5)], env=[] if i == 0 else [9, 9, 9]) for i in range(n)
    ]


def _single() -> Trajectory:
    t = Trajectory(session_id="one")
    add_segment(t, [1] * 10, _turns(6))
    return roundtrip(t)


def _subagents() -> Trajectory:
    t = Trajectory(session_id="sub")
    add_segment(t, [1] * 10, _turns(6))
    add_segment(t, [2] * 8, _turns(3), kind="side")
    add_segment(t, [3] * 8, _turns(3), kind="side")
    return roundtrip(t)


def _compaction() -> Trajectory:  # a compaction after 8 of 14 turns: a rewritten main segment
    t = Trajectory(session_id="compact")
    add_segment(t, [1] * 10, _turns(8))
    add_segment(t, [1] * 12, _turns(6), rewritten=True)
    return roundtrip(t)


def _template_rewrite() -> Trajectory:  # a template-forced new segment after turn 4
    t = Trajectory(session_id="tmpl")
    add_segment(t, [1] * 10, _turns(4))
    add_segment(t, [1] * 30, _turns(6), rewritten=True)
    return roundtrip(t)


def _rewrite_every_turn() -> Trajectory:
    t = Trajectory(session_id="every")
    for i in range(10):
        add_segment(t, [1] * (10 + 8 * i), _turns(1), rewritten=i > 0)
    return roundtrip(t)


def _policy_tokens(trajs: list[Trajectory | None]) -> int:
    return sum(sum(s.response_mask) for t in trajs if t is not None for s in t.segments)


def _trial(
    traj: Trajectory | None, res, steps: list[Trajectory | None] | None = None, version=4
) -> StepTrial:
    spec = TrialSpec(batch_id="b", task_path="/t", task_name="t", scaffold="oracle", policy_version=version)
    return StepTrial(spec=spec, result=res, trajectory=traj, step_trajectories=steps or [])


async def _through_verl(loop, tokenizer, trial: StepTrial):
    converted, metrics = loop._convert(trial, logprobs=True)
    outs = [loop._output(converted, s, trial, metrics) for s in converted.samples]
    return outs, await verl_batch(bare_worker(tokenizer, P_LEN, R_LEN), outs)


def _three_steps():
    steps = []
    for i in range(3):
        t = Trajectory(session_id=f"step{i}")
        add_segment(t, [1] * 10, _turns(4, first_gen=100 + 40 * i))
        steps.append(roundtrip(t))
    res = result(
        reward=0.5,
        step_results=[
            StepResult(name=n, reward=r, reward_valid=True, trajectory_uri=f"s3://b/{n}.npz")
            for n, r in (("a", 1.0), ("b", 0.0), ("c", 0.5))
        ],
    )
    return steps, res


@pytest.mark.parametrize(
    "build",
    [_single, _subagents, _compaction, _template_rewrite, _rewrite_every_turn],
    ids=lambda f: f.__name__,
)
async def test_every_policy_token_reaches_the_loss(loop, tokenizer, build):
    traj = build()
    outs, batch = await _through_verl(loop, tokenizer, _trial(traj, result(reward=1.0)))
    assert int(batch.batch["response_mask"].sum()) == _policy_tokens([traj])  # 100%, in verl's tensors
    # one sample per segment, all in the prompt's group with the trial's reward on the last token
    assert len(outs) == len(traj.segments)
    assert batch.batch["rm_scores"].sum(dim=1).tolist() == [1.0] * len(outs)
    m = step_metrics(o.extra_fields for o in outs)
    assert m["trialflow/tokens/trained_fraction"] == 1.0 and m["trialflow/samples_per_trial"] == len(outs)


async def test_multi_step_every_step_trains_with_the_combined_reward(loop, tokenizer):
    steps, res = _three_steps()
    outs, batch = await _through_verl(loop, tokenizer, _trial(None, res, steps))
    assert int(batch.batch["response_mask"].sum()) == _policy_tokens(steps)
    assert [o.extra_fields["step"] for o in outs] == ["b", "c", "a"]  # [*extras, primary]
    # verl's v1 worker gives every output of a run the last one's reward: the combined one
    assert batch.batch["rm_scores"].sum(dim=1).tolist() == [0.5] * 3
    assert outs[0].extra_fields["step_rewards"] == {"a": 1.0, "b": 0.0, "c": 0.5}


async def test_drop_is_counted_by_cause(tokenizer, tiny_model_dir):
    drop = instantiate_loop(
        tokenizer,
        tiny_model_dir,
        P_LEN,
        R_LEN,
        replicas=["http://127.0.0.1:1"],
        side_segments="drop",
        rewritten_segments="drop",
    )
    traj = _subagents()
    outs, batch = await _through_verl(drop, tokenizer, _trial(traj, result()))
    m = step_metrics(o.extra_fields for o in outs)
    trained = int(batch.batch["response_mask"].sum())
    assert m["trialflow/tokens/trained"] == trained == 30  # the main segment's 6 turns
    assert m["trialflow/tokens/dropped/side"] == 30 and m["trialflow/tokens/generated"] == 60
    assert m["trialflow/tokens/trained_fraction"] == 0.5


async def test_a_cut_response_never_carries_the_reward(tokenizer, tiny_model_dir):
    short = instantiate_loop(tokenizer, tiny_model_dir, P_LEN, 20, replicas=["http://127.0.0.1:1"])
    traj = _single()  # 30 generated + 15 tool tokens: longer than 20
    trial = _trial(traj, result(reward=1.0))
    converted, metrics = short._convert(trial, logprobs=True)
    outs = [short._output(converted, s, trial, metrics) for s in converted.samples]
    batch = await verl_batch(bare_worker(tokenizer, P_LEN, 20), outs)
    assert batch.batch["responses"].shape[1] == 20
    # the reward sits on the cut prefix's last token, but no token of it is trained
    assert int(batch.batch["response_mask"].sum()) == 0
    assert outs[0].extra_fields["masked_by"] == "cut"
    m = step_metrics(o.extra_fields for o in outs)
    # all 30 policy tokens of the segment: the 14 kept in the cut prefix and the 16 past it
    assert m["trialflow/samples/cut"] == 1 and m["trialflow/tokens/masked/cut"] == 30


async def test_overlong_trial_within_budget_trains_unless_filtered(loop, tokenizer, tiny_model_dir):
    # the session refused the turn past the trainer's budget: the trial ended overlong and fits
    res = result(reward=0.0, termination="overlong")
    outs, batch = await _through_verl(loop, tokenizer, _trial(_single(), res))
    assert int(batch.batch["response_mask"].sum()) == 30
    dapo = instantiate_loop(
        tokenizer, tiny_model_dir, P_LEN, R_LEN, replicas=["http://127.0.0.1:1"], overlong_filter=True
    )
    outs, batch = await _through_verl(dapo, tokenizer, _trial(_single(), res))
    assert int(batch.batch["response_mask"].sum()) == 0
    assert step_metrics(o.extra_fields for o in outs)["trialflow/tokens/masked/overlong_filter"] == 30


async def test_placeholder_samples_carry_integer_versions_for_v1(loop, tokenizer):
    outs, _ = await _through_verl(
        loop, tokenizer, _trial(None, result(valid=False, termination="infra_error"))
    )
    ef = outs[0].extra_fields
    # verl v1's metrics do np.array([...min_global_steps...], dtype=int)
    assert np.array([ef["min_global_steps"], ef["max_global_steps"]], dtype=int).tolist() == [4, 4]


# --- groups: no false zero, checked through verl's own advantage estimators -----------------


def _group_batch(rewards: list[float], valid: list[bool], uids: list[str]):
    """A verl DataProto as the classic trainer holds it after the union: rm_scores on the
    last response token, response_mask, uid."""
    from verl import DataProto

    n, width = len(rewards), 6
    mask = torch.ones(n, width, dtype=torch.int64)
    scores = torch.zeros(n, width)
    scores[:, -1] = torch.tensor(rewards)
    for i, ok in enumerate(valid):
        if not ok:
            mask[i] = 0  # the member itself is masked by the conversion (mask_invalid)
    nt = {
        "uid": np.array(uids, dtype=object),
        "trial_id": np.array([f"t{i}" for i in range(n)], dtype=object),
        "reward_valid": np.array(valid, dtype=object),
        "termination_reason": np.array(["submitted" if v else "infra_error" for v in valid], dtype=object),
        "policy_tokens": np.array([width] * n, dtype=object),
        "trained_tokens": np.array([int(m.sum()) for m in mask], dtype=object),
        "masked": np.array([not v for v in valid], dtype=object),
        "masked_by": np.array([None if v else "invalid" for v in valid], dtype=object),
        "overlong": np.array([False] * n, dtype=object),
        "dropped_tokens": np.array([{}] * n, dtype=object),
    }
    return DataProto.from_dict(
        tensors={"response_mask": mask, "token_level_rewards": scores, "responses": mask.clone()},
        non_tensors=nt,
    )


def _advantages(batch, estimator: str, norm: bool = True) -> torch.Tensor:
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import compute_advantage

    return compute_advantage(
        batch, AdvantageEstimator(estimator), norm_adv_by_std_in_grpo=norm, num_repeat=1
    ).batch["advantages"]


@pytest.mark.parametrize(("estimator", "norm"), [("grpo", True), ("grpo", False), ("rloo", True)])
def test_an_invalid_member_changes_no_valid_advantage(estimator, norm):
    # group a: 3 successes + 1 infra failure (0.0 stands in); group b: clean
    rewards = [1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    valid = [True, True, True, False, True, True, True, True]
    uids = ["a"] * 4 + ["b"] * 4
    old = _group_batch(rewards, valid, uids)
    leaked = _advantages(old, estimator, norm)
    # the false zero this fixes: each success of group a is pushed up although every valid
    # member succeeded (GRPO +0.5, Dr.GRPO +0.25, RLOO +0.33)
    assert leaked[0, -1] > 0.2
    masked = _group_batch(rewards, valid, uids)
    apply_group_mask(masked, masked.non_tensor_batch["uid"])
    adv = _advantages(masked, estimator, norm)
    # group a adds nothing to the loss: every token of it is masked (verl's agg_loss skips them)
    assert (adv[:4] * masked.batch["response_mask"][:4]).abs().sum() == 0
    assert masked.batch["response_mask"][:4].sum() == 0
    assert list(masked.non_tensor_batch["masked_by"][:4]) == ["invalid_group"] * 3 + ["invalid"]
    # group b's advantages equal those of a batch without group a
    alone = _group_batch(rewards[4:], valid[4:], uids[4:])
    torch.testing.assert_close(adv[4:], _advantages(alone, estimator, norm))
    m = step_metrics(
        {k: masked.non_tensor_batch[k][i] for k in masked.non_tensor_batch} for i in range(len(rewards))
    )
    assert m["trialflow/tokens/masked/invalid_group"] == 18 and m["trialflow/tokens/masked/invalid"] == 6
    assert m["trialflow/trials/invalid/infra_error"] == 1


def test_groups_to_mask():
    assert groups_to_mask(["a", "a", "b", "c"], [True, False, True, True]) == [True, True, False, False]
    with pytest.raises(ValueError):
        groups_to_mask(["a"], [])


class _CannedLoop(TemporalAgentLoop):
    """The real loop with its trial I/O replaced: each session's result is canned."""

    results: dict[int, object] = {}

    async def _run_trial(self, spec):
        session = int(spec.metadata["rollout"])
        await asyncio.sleep(0.01 * (4 - session))  # siblings end in another order than they start
        res = self.results[session]
        if isinstance(res, Exception):
            raise res
        return _trial(_single(), res)


def _v1_kwargs(session: int) -> dict:
    # what verl's v1 worker passes to run(): the prompt's fields, global_steps, index, session_id
    return {
        "uid": "prompt-7",
        "global_steps": 3,
        "index": 7,
        "session_id": session,
        "extra_info": {"trialflow": {"task_path": "/tasks/t"}},
    }


async def _v1_group(loop, n: int):
    # as AgentLoopWorkerTQ._run_prompt: all sessions created before any awaits
    tasks = [asyncio.create_task(loop.run({}, **_v1_kwargs(i))) for i in range(n)]
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_v1_group_with_an_invalid_member_is_masked_whole(tokenizer, tiny_model_dir):
    loop = instantiate_loop(tokenizer, tiny_model_dir, P_LEN, R_LEN, n=4, replicas=["http://127.0.0.1:1"])
    loop.__class__ = _CannedLoop
    _CannedLoop.results = {
        0: result(),
        1: result(),
        2: result(valid=False, termination="infra_error"),
        3: result(),
    }
    outs = await _v1_group(loop, 4)
    assert [sum(o.response_mask) for o in outs] == [0, 0, 0, 0]
    assert [o.extra_fields["masked_by"] for o in outs] == ["invalid_group"] * 2 + ["invalid", "invalid_group"]
    _CannedLoop.results = {i: result() for i in range(4)}
    outs = await _v1_group(loop, 4)
    assert [sum(o.response_mask) for o in outs] == [30] * 4  # a clean group trains whole
    # a session that raises spoils its group and never leaves the others waiting
    _CannedLoop.results = {0: result(), 1: RuntimeError("store down"), 2: result(), 3: result()}
    outs = await asyncio.wait_for(_v1_group(loop, 4), 10)
    assert isinstance(outs[1], RuntimeError)
    assert [sum(o.response_mask) for i, o in enumerate(outs) if i != 1] == [0, 0, 0]


async def test_gate_groups_are_per_key_and_start_afresh():
    gate = GroupGate()
    a1, a2, b1 = gate.join("a"), gate.join("a"), gate.join("b")
    assert await b1.settle(False) is False  # alone in its group
    r1 = asyncio.create_task(a1.settle(True))
    await asyncio.sleep(0)
    assert not r1.done()  # waits for its sibling
    assert await a2.settle(True) is True and await r1 is True
    assert await gate.join("a").settle(True) is True  # a later run with the key: a new group


def test_trainers_refused_with_what_to_change(tokenizer, tiny_model_dir):
    from omegaconf import OmegaConf

    from trialflow.verl.agent_loop import LoopConfig

    classic = OmegaConf.create({"trainer": {"use_v1": False}})
    with pytest.raises(UnsupportedTrainer, match="side_segments: drop"):
        check_trainer(classic, LoopConfig())
    check_trainer(classic, LoopConfig(side_segments="drop", rewritten_segments="drop", step_segments="drop"))
    check_trainer(OmegaConf.create({"trainer": {"use_v1": True}}), LoopConfig())
    with pytest.raises(UnsupportedTrainer, match="fully-async"):
        check_trainer(OmegaConf.create({"async_training": {"staleness_threshold": 0.1}}), LoopConfig())
    v1 = OmegaConf.create({"trainer": {"use_v1": True}})
    with pytest.raises(
        UnsupportedTrainer, match="leave actor_rollout_ref.rollout.agent.agent_loop_manager_class"
    ):
        TemporalAgentLoopManager(v1)
