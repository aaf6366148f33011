"""Trials end to end through the REAL activities: Temporal dev server, Docker, SeaweedFS.

One in-process worker (`WorkerProcess`, no model: oracle/nop/test scaffolds only) serves
the module on its own task queue. Covers: oracle solves every sample task that has a
working verifier (reward 1), nop solves none, the broken-verifier and slow-verifier
samples give invalid rewards with the reason recorded, a Dockerfile that fails to build
fails fast and non-retryably with the error in the result, a scaffold that crashes is a
`scaffold_error` outcome, results and logs land in S3, and no container is left behind.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import boto3
import pytest

from tests._worker_fixtures import worker_settings
from trialflow import batch
from trialflow.errors import UnknownScaffold
from trialflow.sandbox.base import ExecResult
from trialflow.scaffolds import (
    Scaffold,
    ScaffoldContext,
    ScaffoldResult,
    register_scaffold,
)
from trialflow.settings import TrialflowSettings
from trialflow.storage import TrialKeys, open_store
from workflows.shared import TrialResult

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "tasks"
BROKEN_DOCKERFILE = REPO / "tests" / "trialflow" / "fixtures" / "tasks" / "broken-dockerfile"
SOLVABLE = [
    "compose-services",
    "create-file",
    "fix-bug",
    "log-pipeline",
    "multi-step",
    "reward-json",
    "separate-verifier",
]

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]


class CrashingScaffold(Scaffold):
    """Test scaffold: the agent process dies with exit code 3 after touching the sandbox."""

    name = "test-crash"
    needs_model = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        res: ExecResult = await ctx.sandbox.exec("echo about to crash >&2; exit 3", timeout_s=30)
        return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)


register_scaffold("test-crash", f"{__name__}:CrashingScaffold")


class PlantingScaffold(Scaffold):
    """Test scaffold: an agent that does not solve the task but plants what could fool a
    verifier in its sandbox: rewards, a daemon rewriting them, a forged grader, and its
    report as a link to the grader's expected file."""

    name = "test-plant"
    needs_model = False
    ATTACK = (
        "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
        "printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/cmp && ln -sf /tests/expected.txt /app/report.txt && "
        "(setsid nohup bash -c 'while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done' "
        ">/dev/null 2>&1 &)"
    )

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        res: ExecResult = await ctx.sandbox.exec(self.ATTACK, user="0", timeout_s=30)
        return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)


register_scaffold("test-plant", f"{__name__}:PlantingScaffold")


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client) -> TrialflowSettings:
    return worker_settings(
        "pipeline",
        temporal_address,
        s3_endpoint,
        docker_client,
        max_concurrent_trials=3,
    )


async def _run(client, settings, specs) -> list[TrialResult]:
    return await batch.run(client, specs, task_queue=settings.task_queue)


def _s3_keys(settings: TrialflowSettings, prefix: str) -> list[str]:
    s3 = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id=settings.s3_access_key,
        aws_secret_access_key=settings.s3_secret_key,
    )
    listed = s3.list_objects_v2(Bucket=settings.s3_bucket, Prefix=f"{settings.s3_prefix}/{prefix}")
    return [o["Key"] for o in listed.get("Contents", [])]


async def test_oracle_solves_every_sample_task(client, settings, worker, no_leaked_sandboxes):
    tasks = sorted(p for p in EXAMPLES.iterdir() if (p / "task.toml").exists())
    specs = batch.make_specs(f"oracle-{uuid.uuid4().hex[:6]}", tasks, "oracle", attempt_limit=1)
    results = {r.task_name: r for r in await _run(client, settings, specs)}
    for name in SOLVABLE:
        r = results[name]
        assert (r.reward, r.reward_valid, r.termination_reason, r.error) == (
            1.0,
            True,
            "submitted",
            None,
        ), r.reward_error
    # Samples whose verifier itself is broken: an outcome with the reason, not a crash.
    assert not results["verifier-error"].reward_valid
    assert results["verifier-error"].reward_error.startswith("RewardMissing")
    assert not results["verifier-timeout"].reward_valid
    assert results["verifier-timeout"].reward_error.startswith("VerifierTimeout")
    r = results["create-file"]
    assert set(r.timings) == {"setup", "scaffold", "verify", "teardown"}
    keys = _s3_keys(settings, f"batches/{r.batch_id}/trials/{r.trial_id}/")
    assert any(k.endswith("/result.json") for k in keys)
    assert any(k.endswith("attempt-1/logs/scaffold.log") for k in keys)
    assert any("attempt-1/logs/verifier/" in k for k in keys)
    # A verifier that wrote no valid reward is not "submitted" (issue 13).
    assert results["verifier-error"].termination_reason == "verifier_error"
    assert results["verifier-timeout"].termination_reason == "verifier_error"
    assert worker.metrics.value("trialflow_trials_completed_total", {"termination": "submitted"}) >= 4
    assert worker.metrics.value("trialflow_trials_completed_total", {"termination": "verifier_error"}) >= 2


async def test_nop_solves_none(client, settings, worker, no_leaked_sandboxes):
    tasks = [EXAMPLES / name for name in SOLVABLE]
    specs = batch.make_specs(f"nop-{uuid.uuid4().hex[:6]}", tasks, "nop", attempt_limit=1)
    results = await _run(client, settings, specs)
    assert [(r.reward, r.reward_valid, r.error) for r in results] == [(0.0, True, None)] * len(SOLVABLE)


async def test_broken_dockerfile_fails_fast_non_retryable(client, settings, worker, no_leaked_sandboxes):
    specs = batch.make_specs(f"broken-{uuid.uuid4().hex[:6]}", [BROKEN_DOCKERFILE], "oracle")
    started = time.monotonic()
    [r] = await _run(client, settings, specs)
    elapsed = time.monotonic() - started
    assert r.error is not None and r.error.type == "ImageBuildFailed" and r.error.non_retryable
    assert r.error.phase == "setup" and r.attempts == 1
    assert "broken-dockerfile-marker" in r.error.message  # the build log tail is kept
    assert r.termination_reason == "setup_error" and not r.reward_valid
    assert elapsed < 60, f"took {elapsed:.0f}s: a non-retryable error must not be retried"


async def test_crashing_scaffold_is_an_outcome_and_still_verified(
    client, settings, worker, no_leaked_sandboxes
):
    specs = batch.make_specs(f"crash-{uuid.uuid4().hex[:6]}", [EXAMPLES / "create-file"], "test-crash")
    [r] = await _run(client, settings, specs)
    assert r.termination_reason == "scaffold_error"
    assert r.error is not None and r.error.type == "ScaffoldExit" and "code 3" in r.error.message
    assert "about to crash" in r.error.message
    assert r.reward_valid and r.reward == 0.0  # verified anyway: the file was never made
    assert r.logs_uri and r.logs_uri.endswith("logs/scaffold.log")


async def test_unknown_scaffold_is_a_recorded_non_retryable_error(
    client, settings, worker, no_leaked_sandboxes
):
    with pytest.raises(UnknownScaffold):  # the client refuses it before submitting ...
        batch.make_specs("unknown", [EXAMPLES / "create-file"], "no-such-agent")
    # ... and a worker that cannot build it records the error (the client left it to the workers)
    specs = batch.make_specs(
        f"unknown-{uuid.uuid4().hex[:6]}", [EXAMPLES / "create-file"], "no-such-agent", check=False
    )
    [r] = await _run(client, settings, specs)
    assert r.error is not None and r.error.type == "UnknownScaffold" and r.error.non_retryable
    assert "oracle" in r.error.message  # the message lists the registered names


def test_trial_keys_match_the_listed_uris(settings):
    """The attempt URI the workflow lists is the store's own URI of TrialKeys.root."""
    store = open_store(settings)
    keys = TrialKeys("b", "trial-b-t-0", 2)
    assert store.uri(keys.root) == f"s3://{settings.s3_bucket}/{settings.s3_prefix}/{keys.root}"


async def test_harbor_semantics_end_to_end(client, settings, worker, no_leaked_sandboxes, tmp_path):
    """Issue 13 through the real pipeline: two tasks sharing a basename are two trials;
    a failing healthcheck is a non-retried setup_error; artifacts land in the store."""
    import shutil

    a, b, hc = tmp_path / "suite-a" / "create-file", tmp_path / "suite-b" / "create-file", tmp_path / "hc"
    shutil.copytree(EXAMPLES / "create-file", a)
    shutil.copytree(EXAMPLES / "create-file", b)
    (a / "task.toml").write_text('artifacts = ["/etc/hostname"]\n' + (a / "task.toml").read_text())
    shutil.copytree(EXAMPLES / "create-file", hc)
    (hc / "task.toml").write_text(
        (hc / "task.toml").read_text()
        + '\n[environment.healthcheck]\ncommand = "test -f /never"\ninterval_sec = 0.2\nretries = 2\n'
    )
    specs = batch.make_specs(f"harbor-{uuid.uuid4().hex[:6]}", [a, b, hc], "oracle", attempt_limit=2)
    results = await _run(client, settings, specs)
    ra, rb, rh = results
    assert (ra.task_name, rb.task_name) == ("suite-a/create-file", "suite-b/create-file")
    assert ra.trial_id != rb.trial_id and ra.reward == rb.reward == 1.0
    assert rh.termination_reason == "setup_error" and rh.attempts == 1
    assert rh.error is not None and rh.error.type == "HealthcheckFailed" and rh.error.non_retryable
    keys = _s3_keys(settings, f"batches/{ra.batch_id}/trials/{ra.trial_id}/attempt-1/logs/artifacts/")
    assert any(k.endswith("artifacts/etc/hostname") for k in keys), keys
    assert any(k.endswith("artifacts/manifest.json") for k in keys)


async def test_separate_verifier_end_to_end(client, settings, worker, no_leaked_sandboxes):
    """The separate verifier environment through the real pipeline: oracle passes, nop
    fails, an agent planting rewards and links gets 0; the agent's report reaches the
    store as an artifact; no container (agent's or verifier's) is left."""
    task = EXAMPLES / "separate-verifier"
    batch_id = f"separate-{uuid.uuid4().hex[:6]}"
    specs = [
        *batch.make_specs(batch_id, [task], "oracle", attempt_limit=1),
        *batch.make_specs(batch_id + "-nop", [task], "nop", attempt_limit=1),
        *batch.make_specs(batch_id + "-plant", [task], "test-plant", attempt_limit=1),
    ]
    oracle, nop, plant = await _run(client, settings, specs)
    assert (oracle.reward, oracle.reward_valid, oracle.termination_reason) == (1.0, True, "submitted")
    assert (nop.reward, nop.reward_valid, nop.termination_reason) == (0.0, True, "submitted")
    assert (plant.reward, plant.reward_valid, plant.termination_reason) == (0.0, True, "submitted"), plant
    keys = _s3_keys(settings, f"batches/{oracle.batch_id}/trials/{oracle.trial_id}/attempt-1/logs/")
    assert any(k.endswith("artifacts/app/report.txt") for k in keys), keys
    assert any(k.endswith("verifier/stdout.txt") for k in keys)


async def test_a_broken_verifier_environment_is_a_verifier_error(
    client, settings, worker, no_leaked_sandboxes, tmp_path
):
    """A verifier image whose ENTRYPOINT exits: the task's fault, found when verification
    starts: not retried, termination verifier_error (never submitted), nothing left."""
    import shutil

    task = tmp_path / "separate-verifier"
    shutil.copytree(EXAMPLES / "separate-verifier", task)
    with (task / "tests" / "Dockerfile").open("a") as f:
        f.write('ENTRYPOINT ["sh", "-c", "echo grader-misconfigured >&2; exit 4"]\n')
    [r] = await _run(client, settings, batch.make_specs(f"svbroken-{uuid.uuid4().hex[:6]}", [task], "oracle"))
    assert r.termination_reason == "verifier_error" and not r.reward_valid
    assert r.error is not None and r.error.type == "EntrypointExited" and r.error.phase == "verify"
    assert r.attempts == 1 and "grader-misconfigured" in r.error.message


async def test_an_unhealthy_compose_service_is_a_setup_error(
    client, settings, worker, no_leaked_sandboxes, tmp_path
):
    """A compose service whose healthcheck fails: set-up fails once, typed and not retried
    (termination setup_error, the engine's reason in the error); no container of the pod
    is left (the fixture checks every container of this worker)."""
    import shutil

    task = tmp_path / "compose-unhealthy"
    shutil.copytree(EXAMPLES / "compose-services", task)
    compose = task / "environment" / "docker-compose.yaml"
    compose.write_text(
        compose.read_text().replace(
            "curl -fsS http://localhost:6000/ready", "curl -fsS http://localhost:6000/nope"
        )
    )
    specs = batch.make_specs(f"unhealthy-{uuid.uuid4().hex[:6]}", [task], "oracle", attempt_limit=2)
    (r,) = await _run(client, settings, specs)
    assert r.termination_reason == "setup_error", r
    assert r.error is not None and r.error.type == "ServiceUnhealthy", r.error
    assert r.error.non_retryable and r.error.attempt == 1  # the task's fault: one attempt of two
    assert "service kv is unhealthy" in r.error.message and "404" in r.error.message
