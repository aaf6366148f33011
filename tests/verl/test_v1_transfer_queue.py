"""Our outputs through verl 0.9.1's REAL v1 worker path: ``AgentLoopWorkerTQ._agent_loop_postprocess``
puts every output of one run into a REAL TransferQueue, and v1's trainer reads them back
(its metrics cast every tag's ``min/max_global_steps`` to int). A run with several samples
(sub-agents, a compaction, later steps) used to raise ``KeyError('reward_extra_info')`` there."""

from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.verl._support import bare_worker, instantiate_loop, result
from tests.verl.test_learning_signal import _compaction, _policy_tokens, _subagents, _trial

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
P_LEN, R_LEN = 64, 256


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _tq_worker(tokenizer):
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    w = bare_worker(tokenizer, P_LEN, R_LEN)
    # verl's v1 worker class itself (under its Ray actor wrapper), without Ray or model loading
    w.__class__ = AgentLoopWorkerTQ.__ray_metadata__.modified_class
    return w


@pytest.mark.parametrize(
    "build", [_subagents, _compaction, None], ids=["subagents", "compaction", "placeholder"]
)
async def test_every_output_of_a_run_lands_in_transfer_queue(
    transfer_queue, tokenizer, tiny_model_dir, build
):
    tq = transfer_queue
    loop = instantiate_loop(tokenizer, tiny_model_dir, P_LEN, R_LEN, replicas=["http://127.0.0.1:1"])
    traj = build() if build else None
    res = result(reward=0.75) if build else result(valid=False, termination="infra_error")
    trial = _trial(traj, res)
    converted, metrics = loop._convert(trial, logprobs=True)
    outs = [loop._output(converted, s, trial, metrics) for s in converted.samples]
    uid = f"uid-{build.__name__ if build else 'empty'}"
    raw = [{"role": "user", "content": "task"}]
    await _tq_worker(tokenizer)._agent_loop_postprocess(
        outs if len(outs) > 1 else outs[0], False, uid=uid, session_id=0, global_steps=5, raw_prompt=raw
    )
    keys = [f"{uid}_0_{i}" for i in range(len(outs))]
    listed = tq.kv_list(partition_id="train")["train"]
    tags = [listed[k] for k in keys]
    # what v1's trainer does with the tags (trainer_base._compute_metrics)
    versions = np.array([t["min_global_steps"] for t in tags], dtype=int)
    assert versions.tolist() == [4] * len(outs)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["response_mask", "rm_scores"])
    trained = sum(int(m.sum()) for m in got["response_mask"].unbind(0))
    rewards = [float(r.sum()) for r in got["rm_scores"].unbind(0)]
    if build:
        assert trained == _policy_tokens([traj])  # every policy token, one sample per segment
        assert rewards == [0.75] * len(outs)
    else:
        assert trained == 0 and len(outs) == 1  # the invalid trial's placeholder, masked
