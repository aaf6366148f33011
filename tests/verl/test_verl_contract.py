"""Our outputs against REAL verl 0.9.1: config loading, instantiation, per-sample and batch
post-processing (padding, masks, rm_scores, routed experts), and the v1 ``as_dict`` path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from proxy.trajectory import Trajectory
from tests.verl._support import (
    LAYERS,
    TOP_K,
    Turn,
    add_segment,
    bare_worker,
    instantiate_loop,
    result,
    roundtrip,
    verl_batch,
)
from trialflow.verl.agent_loop import (
    LoopConfig,
    TemporalAgentLoop,
    TrialIdentityError,
    resolve_identity,
    stamp_identity,
)
from trialflow.verl.convert import ConvertConfig, convert_trial, extra_fields, loop_metrics
from workflows.shared import RunNetwork

P_LEN, R_LEN = 12, 16


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _outputs(experts: bool) -> list[AgentLoopOutput]:
    """normal, overlong, prompt spill, no trajectory, rewritten-only: as the loop builds them."""
    cfg = ConvertConfig(P_LEN, R_LEN, filler_token_id=0, experts_shape=(LAYERS, TOP_K) if experts else None)
    trajs = []
    t = Trajectory(session_id="a")
    add_segment(
        t,
        list(range(100, 108)),
        [
            Turn(gen=[1, 2, 3], experts=experts, version=3),
            Turn(gen=[4], env=[60, 61], experts=experts, version=4),
        ],
    )
    trajs.append(t)
    t = Trajectory(session_id="b")
    add_segment(
        t,
        list(range(100, 105)),
        [
            Turn(gen=list(range(1, 12)), experts=experts),
            Turn(gen=list(range(20, 30)), env=[60] * 3, experts=experts),
        ],
    )
    trajs.append(t)
    t = Trajectory(session_id="c")
    add_segment(t, list(range(100, 120)), [Turn(gen=[5, 6], experts=experts)])
    trajs.append(t)
    trajs.append(None)
    t = Trajectory(session_id="e")
    add_segment(t, [7, 7, 7], [Turn(gen=[8])], rewritten=True)
    trajs.append(t)
    outs = []
    for i, traj in enumerate(trajs):
        traj = roundtrip(traj) if traj is not None else None
        res = result(reward=float(i) / 4, trial_id=f"trial-b-t-{i}")
        conv = convert_trial(traj, res, cfg)
        outs.append(
            AgentLoopOutput(
                **conv.primary.output_fields(),
                reward_score=conv.reward_score,
                num_turns=2,
                metrics=AgentLoopMetrics(**loop_metrics(traj, res)),
                extra_fields=extra_fields(conv, conv.primary, res),
            )
        )
    return outs


@pytest.mark.parametrize("experts", [False, True])
async def test_verl_postprocess_accepts_our_outputs(tokenizer, experts):
    outs = _outputs(experts)
    batch = await verl_batch(bare_worker(tokenizer, P_LEN, R_LEN), outs)
    B = len(outs)
    assert batch.batch["prompts"].shape == (B, P_LEN)
    assert batch.batch["responses"].shape == (B, R_LEN)
    assert batch.batch["input_ids"].shape == (B, P_LEN + R_LEN)
    assert batch.batch["rollout_log_probs"].shape == (B, R_LEN)
    for i, o in enumerate(outs):
        p, r = len(o.prompt_ids), len(o.response_ids)
        assert batch.batch["prompts"][i, P_LEN - p :].tolist() == o.prompt_ids
        assert batch.batch["responses"][i, :r].tolist() == o.response_ids
        assert batch.batch["response_mask"][i, :r].tolist() == o.response_mask
        assert batch.batch["response_mask"][i, r:].sum() == 0
        assert batch.batch["attention_mask"][i].sum() == p + r
        np.testing.assert_allclose(batch.batch["rollout_log_probs"][i, :r].numpy(), o.response_logprobs)
        # the reward sits on the last real response token
        assert batch.batch["rm_scores"][i, r - 1] == pytest.approx(o.reward_score)
        assert batch.batch["rm_scores"][i].sum() == pytest.approx(o.reward_score)
        if experts:
            e = batch.batch["routed_experts"][i]
            assert e.shape == (P_LEN + R_LEN, LAYERS, TOP_K)
            np.testing.assert_array_equal(e[P_LEN - p : P_LEN + r].numpy(), o.routed_experts)
            assert e[: P_LEN - p].abs().sum() == 0 and e[P_LEN + r :].abs().sum() == 0
    if not experts:
        assert "routed_experts" not in batch.batch.keys()
    assert outs[1].extra_fields["overlong"] and outs[2].extra_fields["prompt_spill"] == 8
    assert list(batch.non_tensor_batch["trial_id"]) == [f"trial-b-t-{i}" for i in range(B)]
    assert list(batch.non_tensor_batch["min_global_steps"])[0] == 3
    # the cut (overlong) sample and the placeholder are masked
    assert list(batch.non_tensor_batch["masked"]) == [False, True, False, True, False]
    assert list(batch.non_tensor_batch["masked_by"]) == [None, "cut", None, None, None]


def test_v1_as_dict_aligns_experts_over_the_whole_sequence():
    for o in _outputs(experts=True):
        d = o.as_dict()
        n = len(o.prompt_ids) + len(o.response_ids)
        assert d["routed_experts"].shape == (n, LAYERS, TOP_K) and d["routed_experts"].dtype == torch.int16
        assert d["rm_scores"][-1] == pytest.approx(o.reward_score)
        assert d["extra_fields"]["trial_id"].startswith("trial-b-t-")


def _instantiate(tokenizer, model_dir, **overrides):
    return instantiate_loop(tokenizer, model_dir, P_LEN, R_LEN, **overrides)


def test_yaml_entry_instantiates_through_verls_registry(tokenizer, tiny_model_dir):
    loop = _instantiate(tokenizer, tiny_model_dir, routed_experts=[LAYERS, TOP_K], side_segments="drop")
    assert isinstance(loop, TemporalAgentLoop)
    assert loop.loop_config == LoopConfig(routed_experts=(LAYERS, TOP_K), side_segments="drop")
    assert loop.convert_config.prompt_length == P_LEN and loop.convert_config.response_length == R_LEN
    assert loop.convert_config.experts_shape == (LAYERS, TOP_K)
    assert loop.convert_config.filler_token_id == tokenizer.pad_token_id


async def test_build_spec_from_a_stamped_row(tokenizer, tiny_model_dir):
    loop = _instantiate(
        tokenizer, tiny_model_dir, replicas=["http://10.0.0.1:8000"], sampling={"max_tokens": 64}
    )
    nt = {
        "uid": np.array(["u1", "u1", "u2", "u2"], dtype=object),
        "extra_info": np.array([{"trialflow": {"task_path": "/tasks/hello-world/"}}] * 4, dtype=object),
    }
    stamp_identity(nt, {"global_steps": 7})
    kwargs = {k: v[3] for k, v in nt.items()}
    spec = await loop.build_spec({"temperature": 0.7, "top_p": 0.9, "top_k": -1, "logprobs": True}, kwargs)
    assert spec.trial_id == "trial-exp-train-step7-hello-world-3"  # row 1, rollout 1 of 2
    assert spec.step == 7 and spec.replicas == ["http://10.0.0.1:8000"]
    # training step 7 samples the weights of verl's update_weights(6) (SampleIdentity.policy_version)
    assert spec.policy_version == 6
    assert spec.sampling.overrides() == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "max_tokens": 64}
    assert spec.model == str(tiny_model_dir) and spec.scaffold == "terminus"
    # the session keeps the trajectory inside the sample verl trains (proxy.session)
    cc = loop.convert_config
    assert (spec.max_context_tokens, spec.max_response_tokens) == (
        cc.prompt_length + cc.response_length,
        cc.response_length,
    )
    assert spec.network == RunNetwork()  # agent no-network, verifier public (Harbor's default)
    again = await loop.build_spec({}, {k: v[3] for k, v in nt.items()})
    assert again.trial_id == spec.trial_id  # a restarted trainer derives the same id
    closed = _instantiate(
        tokenizer,
        tiny_model_dir,
        replicas=["http://10.0.0.1:8000"],
        settings={"verifier_network": "no-network"},
    )
    assert (await closed.build_spec({}, kwargs)).network.verifier == "no-network"  # the loop's settings
    with pytest.raises(TrialIdentityError):
        await loop.build_spec({}, {"extra_info": {"trialflow": {"task_path": "/tasks/x"}}})


def test_stamp_identity_groups_rollouts_by_uid():
    nt = {"uid": np.array(["a", "a", "a", "b", "b", "b"], dtype=object)}
    stamp_identity(nt, {"global_steps": 3, "validate": True})
    assert nt["trialflow_row"].tolist() == [0, 0, 0, 1, 1, 1]
    assert nt["trialflow_rollout"].tolist() == [0, 1, 2, 0, 1, 2]
    ids = [resolve_identity({k: v[i] for k, v in nt.items()}, 1) for i in range(6)]
    assert [i.sample_index for i in ids] == list(range(6))
    assert all(i.validate and i.step == 3 for i in ids)
    assert ids[0].batch_id("run") == "run-val-step3"
    # validation of step 3 runs after verl's update_weights(3), before the step count moves on
    assert ids[0].policy_version == 3
    no_uid = {"index": np.array([0, 0, 0])}
    stamp_identity(no_uid, {})
    assert no_uid["trialflow_row"].tolist() == [0, 1, 2] and no_uid["trialflow_step"].tolist() == [-1] * 3
    assert resolve_identity({k: v[0] for k, v in no_uid.items()}, 1).policy_version is None  # no step


def test_v1_identity_from_verls_own_kwargs():
    ident = resolve_identity({"global_steps": 5, "index": np.int64(4), "session_id": 1}, 4)
    assert (ident.step, ident.row, ident.rollout, ident.sample_index) == (5, 4, 1, 17)
    # verl's own staleness metric, (global_steps - 1) - max_global_steps, is 0 for it
    assert ident.policy_version == 4
