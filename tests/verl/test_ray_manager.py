"""`TemporalAgentLoopManager` as verl's trainer runs it: a REAL local Ray instance, verl's own
AgentLoopManager.create -> AgentLoopWorker Ray actor (built from verl's composed
``ppo_trainer`` config, our agent-loop YAML loaded by the worker from its path) -> our
TemporalAgentLoop -> REAL Temporal, Docker sandbox, SeaweedFS and the worker's proxy, with
verl's load balancer actor listing the rollout server (the scripted vLLM double: the text is
irrelevant, the tokens are checked against the stored trajectory). One step of two prompts
times two rollouts: the oracle (reward 1) and a two-turn chat through the proxy (reward 0)."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from transformers import AutoTokenizer

from proxy.trajectory import Trajectory
from tests._worker_fixtures import worker_settings
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.verl._support import LOOP_SETTINGS
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult
from trialflow.settings import TrialflowSettings
from trialflow.storage import open_store

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]

REPO = Path(__file__).resolve().parents[2]
TASK = str(REPO / "examples" / "tasks" / "create-file")
P_LEN, R_LEN = 128, 32
CHAT = f"{__name__}:TwoTurns"  # by import path: the Ray actor checks it, the worker runs it


class TwoTurns(Scaffold):
    """Test scaffold: two chat turns through its proxy session, from the worker's host."""

    name = "test-two-turns"
    needs_model = True
    runs_in_sandbox = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=ctx.openai_base_url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "go"}]
        for _ in range(2):
            reply = await client.chat.completions.create(model=ctx.model, messages=messages, max_tokens=8)
            messages += [
                {"role": "assistant", "content": reply.choices[0].message.content or ""},
                {"role": "user", "content": "more"},
            ]
        return ScaffoldResult(0, False, "two turns", "", 0.0)


@pytest.fixture(scope="module")
async def double(tiny_model_dir):
    d = await ScriptedVLLM(AutoTokenizer.from_pretrained(tiny_model_dir), default=Reply("fine")).start()
    yield d
    await d.stop()


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client, tiny_model_dir) -> TrialflowSettings:
    return worker_settings(
        "raymgr",
        temporal_address,
        s3_endpoint,
        docker_client,
        model_dir=tiny_model_dir,
        model_name="scripted",
    )


def _verl_config(tiny_model_dir: Path, loop_yaml: Path):
    """verl's own ppo_trainer config, composed by hydra as ``main_ppo`` does, with the
    overrides docs/verl.md names."""
    import verl
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None
    ):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={tiny_model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                f"actor_rollout_ref.rollout.prompt_length={P_LEN}",
                f"actor_rollout_ref.rollout.response_length={R_LEN}",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.rollout.agent.num_workers=1",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loop_yaml}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=trialflow_temporal",
                "+actor_rollout_ref.rollout.agent.agent_loop_manager_class="
                "trialflow.verl.agent_loop.TemporalAgentLoopManager",  # not in ppo_trainer.yaml: "+"
                "trainer.experiment_name=raymgr",
                "trainer.use_v1=false",  # the classic trainer: the one that needs the manager
            ],
        )


@pytest.fixture(scope="module")
async def manager(ray_local, settings, double, tiny_model_dir, tmp_path_factory):
    """verl's AgentLoopManager.create, as RayPPOTrainer calls it (one AgentLoopWorker actor)."""
    from verl.utils.import_utils import load_class_from_fqn  # what RayPPOTrainer loads it with
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    entry = yaml.safe_load((REPO / "examples" / "verl" / "agent_loop.yaml").read_text())[0]
    entry.update(
        # the classic trainer takes one sample per row (TemporalAgentLoopManager refuses "extra")
        side_segments="drop",
        rewritten_segments="drop",
        step_segments="drop",
        run_name=f"ray-{uuid.uuid4().hex[:6]}",
        model=settings.model_name,
        settings={
            k: str(v) if isinstance(v, Path) else v
            for k, v in settings.model_dump().items()
            if k in LOOP_SETTINGS
        },
    )
    loop_yaml = tmp_path_factory.mktemp("raymgr") / "agent_loop.yaml"
    loop_yaml.write_text(yaml.safe_dump([entry]))
    config = _verl_config(tiny_model_dir, loop_yaml)
    fqn = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    cls = load_class_from_fqn(fqn, "AgentLoopManager")
    balancer = get_router_handle(servers={double.url.removeprefix("http://"): None})
    llm_client = LLMServerClient(config=config, load_balancer_handle=balancer)
    # from an async generator verl's auto_await runs it on a thread of its own (actor creation only)
    mgr = cls.create(config=config, llm_client=llm_client)
    yield mgr, entry["run_name"]
    for actor in mgr.agent_loop_workers:
        ray_local.kill(actor)


def _objects(items: list) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _step_batch(rollouts: int, step: int):
    """The generation batch RayPPOTrainer hands the manager: prompts repeated ``n`` times,
    interleaved, with ``uid`` per prompt and the task under ``extra_info.trialflow``."""
    from verl import DataProto

    rows = [("uid-a", "oracle"), ("uid-b", CHAT)]
    uids, infos, prompts = [], [], []
    for uid, scaffold in rows:
        for _ in range(rollouts):
            uids.append(uid)
            infos.append({"trialflow": {"task_path": TASK, "scaffold": scaffold}})
            prompts.append([{"role": "user", "content": "solve the task"}])
    n = len(uids)
    return DataProto.from_dict(
        tensors={"dummy": torch.zeros(n, 1)},
        non_tensors={
            "uid": _objects(uids),
            "extra_info": _objects(infos),
            "raw_prompt": _objects(prompts),
        },
        meta_info={"global_steps": step, "validate": False},
    )


async def test_one_step_through_verls_ray_agent_loop_manager(
    manager, settings, client, worker, double, no_leaked_sandboxes
):
    mgr, run_name = manager
    before = len(double.requests)
    out = await mgr.generate_sequences(_step_batch(rollouts=2, step=5))

    assert out.batch["responses"].shape == (4, R_LEN) and out.batch["prompts"].shape == (4, P_LEN)
    assert out.batch["rm_scores"].sum(dim=1).tolist() == [1.0, 1.0, 0.0, 0.0]
    ids = list(out.non_tensor_batch["trial_id"])
    assert ids == [f"trial-{run_name}-train-step5-create-file-{i}" for i in range(4)]
    assert list(out.non_tensor_batch["termination_reason"]) == ["submitted"] * 4
    assert "agent_loop/generate_sequences/mean" in out.meta_info["timing"]  # the manager's own metrics
    timing = out.meta_info["timing"]  # verl logs these as timing_s/...
    assert timing["trialflow/trials"] == 4 and timing["trialflow/tokens/trained_fraction"] == 1.0
    assert len(double.requests) - before == 4  # two chat trials x two turns, on verl's server

    store = open_store(settings)
    mask = out.batch["response_mask"]
    for i in (2, 3):  # the chat trials: verl's tensors hold the stored trajectory's tokens
        traj = Trajectory.from_bytes(store.get_bytes(out.non_tensor_batch["trajectory_uri"][i]))
        seg = traj.segments[0]
        n_resp = int(out.batch["attention_mask"][i, P_LEN:].sum())
        assert out.batch["responses"][i, :n_resp].tolist() == list(seg.response_ids[:n_resp])
        assert (
            mask[i, :n_resp].tolist() == list(seg.response_mask[:n_resp]) and 0 in mask[i, :n_resp].tolist()
        )
        assert (seg.policy_version_min, seg.policy_version_max) == (4, 4)  # step 5 samples weights 4
    assert mask[:2].sum() == 0  # the oracle made no model call: a masked placeholder
