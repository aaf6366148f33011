"""Reward integrity end to end (REAL Temporal, Docker, SeaweedFS with credentials and the
worker's real proxy over the ScriptedVLLM double): an attacker task whose "solution" tries
every attack of issue 9 instead of solving the task, next to an honest bystander trial.

The attacker reaches for the proxy's management API and protocol port, S3 (overwriting the
bystander's result), Temporal's gRPC and HTTP ports, the vLLM replica, every loopback port,
a raw socket for sniffing, forks past the pids limit, and leaves behind a daemon rewriting
the reward plus a `cat` that always prints 1. Its verifier records what happened. Asserted:
each attack failed (while the same targets answer from the host), the attacker's reward is
the honest 0, the bystander's result is its own 1, and nothing is left behind.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests._worker_fixtures import worker_settings
from tests.doubles.scripted_vllm import ScriptedVLLM
from trialflow import batch
from trialflow.settings import TrialflowSettings
from trialflow.storage import TrialKeys, open_store, trial_result_key

REPO = Path(__file__).resolve().parents[2]
ATTACKER = Path(__file__).resolve().parent / "attacker"
BYSTANDER = REPO / "examples" / "tasks" / "create-file"

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]


@pytest.fixture(scope="module")
async def double(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    vllm = await ScriptedVLLM(tokenizer=tok, model="tiny").start()
    yield vllm
    await vllm.stop()


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client, tiny_model_dir, double) -> TrialflowSettings:
    return worker_settings(
        "integrity",
        temporal_address,
        s3_endpoint,
        docker_client,
        model_dir=tiny_model_dir,
        replica_urls=[double.url],
        max_concurrent_trials=2,
    )


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=3).close()
    except urllib.error.HTTPError:
        return True  # it answered, with an error status
    except OSError:
        return False
    return True


async def test_every_attack_fails_and_the_rewards_are_honest(
    tmp_path, client, settings, worker, double, s3_endpoint, temporal_address, no_leaked_sandboxes
):
    batch_id = f"attack-{uuid.uuid4().hex[:6]}"
    task = tmp_path / "attacker"
    shutil.copytree(ATTACKER, task)
    bystander_spec, attacker_spec = batch.make_specs(batch_id, [BYSTANDER, task], "oracle", attempt_limit=1)
    proxy = worker.proxy
    assert proxy is not None
    targets = {
        "management_url": proxy.management_url,
        "proxy_url": proxy.base_url,
        "s3_endpoint": s3_endpoint.endpoint_url,
        "bucket": s3_endpoint.bucket,
        "bystander_result_key": f"{settings.s3_prefix}/"
        + trial_result_key(bystander_spec.batch_id, bystander_spec.trial_id),
        "vllm_url": double.url,
        "temporal_address": temporal_address,
        "temporal_http_port": int(temporal_address.rsplit(":", 1)[1]) + 1000,
    }
    (task / "solution" / "targets.json").write_text(json.dumps(targets))
    # The control: from the host, every target answers (so inside, only isolation stops them).
    for url in (
        f"{proxy.management_url}/replicas",
        f"{proxy.base_url}/",
        s3_endpoint.endpoint_url,
        double.url,
    ):
        assert await asyncio.to_thread(_answers, url), url  # the worker's proxy runs in this loop
    with socket.create_connection(tuple(temporal_address.rsplit(":", 1))):  # type: ignore[arg-type]
        pass

    # The bystander runs first, so the attacker has a result to forge.
    [bystander] = await batch.run(client, [bystander_spec], task_queue=settings.task_queue)
    store = open_store(settings)
    before = store.get_bytes(trial_result_key(bystander_spec.batch_id, bystander_spec.trial_id))
    replicas_before = proxy.replica_listing()
    [attacker] = await batch.run(client, [attacker_spec], task_queue=settings.task_queue)

    assert (bystander.reward, bystander.reward_valid) == (1.0, True)
    assert (attacker.reward, attacker.reward_valid, attacker.termination_reason) == (0.0, True, "submitted")
    # The agent phase had no network; the verifiers Harbor's default (after every agent process ended).
    assert attacker.network_modes == {"agent": "no-network", "verifier": "public"} == bystander.network_modes
    keys = TrialKeys(attacker_spec.batch_id, attacker_spec.trial_id, 1)
    seen = json.loads(store.get_bytes(keys.log("verifier/files/attacks.json")))
    for name in (
        "management_replicas",
        "management_policy",
        "management_sessions",
        "proxy_protocol",
        "s3_overwrite",
        "s3_list",
        "vllm_generate",
        "temporal_grpc",
        "temporal_http",
    ):
        assert seen[name].startswith("error"), (name, seen[name])
    assert seen["open_loopback_ports"] == [] and seen["interfaces"] == ["lo"], seen
    assert seen["raw_socket"] == "error PermissionError"
    assert seen["fork_error"] == "BlockingIOError" and seen["forked"] < 1024, seen
    alive = store.get_bytes(keys.log("verifier/files/processes.txt")).decode()
    assert "while :" not in alive, alive  # the daemon did not outlive the agent phase
    assert b"FAIL" in store.get_bytes(keys.log("verifier/stdout.txt"))
    # Nothing the attacker did reached the bystander or the proxy.
    assert store.get_bytes(trial_result_key(bystander_spec.batch_id, bystander_spec.trial_id)) == before
    assert json.loads(before)["reward"] == 1.0
    assert proxy.replica_listing() == replicas_before and proxy.defaults.policy_version is None
    # No forwarder, egress proxy or session listener left on the worker.
    assert not proxy._sessions and len(worker.egresses) == 0
