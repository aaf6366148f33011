"""The shared-mode verification harness against agents that attack it (issue 20), through the
REAL path: Temporal, Docker, SeaweedFS and an in-process worker; the oracle runs each attack
(`harness_attacks/NAME.sh`) as the agent of `harness_task`, a task none of them solves.

Asserted per attack: the honest reward (0; 1 where the work was done), a valid reward, no
`infra_error`, verifier_trust "harness", and what the verifier saw (no process of the agent's,
no unsafe variable, no /etc/ld.so.preload). First, the keep-alive takeover is shown to beat the
old verification (stop_processes, which spared the keep-alive) in the same engine: the attack
is real, the restart is what stops it. And the limit shared mode keeps: a replaced /bin/bash
(test.sh's own interpreter) still fools it, while a separate verifier environment is not fooled.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests._worker_fixtures import worker_settings
from trialflow import batch
from trialflow.sandbox.toolchain import BUSYBOX
from trialflow.separate_verifier import verify_separately
from trialflow.settings import TrialflowSettings
from trialflow.storage import TrialKeys, open_store
from trialflow.tasks import load_task
from trialflow.verifier import run_tests, run_verifier

HERE = Path(__file__).resolve().parent
TASK = HERE / "harness_task"
ATTACKS = HERE / "harness_attacks"
HELPERS = ("inject.py", "evil.sh")

# attack -> the honest reward
EXPECTED = {
    "honest": 1.0,
    "keepalive_takeover": 0.0,
    "planted_tools": 0.0,
    "ld_preload": 0.0,
    "bash_env": 0.0,
    "kill_keepalive": 0.0,
    "solve_then_die": 1.0,
    "daemon_swarm": 0.0,
    "symlinks": 0.0,
    "break_restart": 0.0,
    "toolchain_tamper": 0.0,
    "clutter": 0.0,
}

pytestmark = [pytest.mark.docker]


@pytest.fixture(scope="module")
def evil_so(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the preload attack's library")  # CI=true: a failure
    out = tmp_path_factory.mktemp("evil") / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(ATTACKS / "evil.c")], check=True)
    return out


def _attack_task(root: Path, attack: str, evil_so: Path) -> Path:
    """harness_task with `attack` as its solution (solution/solve.sh plus the helpers)."""
    task = root / attack.replace("_", "-")
    shutil.copytree(TASK, task)
    solution = task / "solution"
    solution.mkdir()
    shutil.copy(ATTACKS / f"{attack}.sh", solution / "solve.sh")
    for helper in HELPERS:
        shutil.copy(ATTACKS / helper, solution / helper)
    shutil.copy(evil_so, solution / "evil.so")
    return task


async def _run_attack(sb, task_dir: Path) -> None:
    await sb.upload(task_dir / "solution", "/solution")
    res = await sb.exec("bash /solution/solve.sh", user="0", timeout_s=120)
    assert res.ok, res


async def test_the_keepalive_takeover_beats_stop_processes_but_not_the_restart(
    tmp_path, sandbox_for, evil_so
):
    task_dir = _attack_task(tmp_path, "keepalive_takeover", evil_so)
    task = load_task(task_dir)
    old = await sandbox_for(task)
    await _run_attack(old, task_dir)
    seen = json.loads((await old.exec(["cat", "/app/inject.json"])).stdout)
    assert seen["ptrace"] == "EPERM", seen  # the seccomp profile
    assert seen["procmem"].startswith("/bin/sh /solution/evil.sh"), seen  # taken over without ptrace
    # The old shared verification: every process killed but the keep-alive, then test.sh.
    await old.stop_processes()
    forged = await run_tests(old, task)
    assert (forged.reward_valid, forged.reward) == (True, 1.0), forged

    new = await sandbox_for(task)
    await _run_attack(new, task_dir)
    honest = await run_verifier(new, task)
    assert (honest.reward_valid, honest.reward) == (True, 0.0), honest
    assert "FAIL" in honest.stdout


async def test_a_planted_preload_reaches_dynamic_binaries_not_the_static_toolchain(
    tmp_path, sandbox_for, evil_so
):
    task_dir = _attack_task(tmp_path, "ld_preload", evil_so)
    sb = await sandbox_for(load_task(task_dir))
    await _run_attack(sb, task_dir)
    reward = "/logs/verifier/reward.txt"
    assert (
        await sb.exec([BUSYBOX, "sh", "-c", f"{BUSYBOX} mkdir -p /logs/verifier && echo 0 > {reward}"])
    ).ok
    assert (await sb.exec([BUSYBOX, "true"])).ok
    assert (await sb.exec([BUSYBOX, "cat", reward])).stdout == "0\n"  # static: the preload never ran
    assert (await sb.exec(["/bin/true"])).ok
    assert (await sb.exec([BUSYBOX, "cat", reward])).stdout == "1\n"  # dynamic: its destructor ran
    # run_verifier removes the file before test.sh (its bash is dynamic): the honest 0.
    verdict = await run_verifier(sb, load_task(task_dir))
    assert (verdict.reward_valid, verdict.reward) == (True, 0.0), verdict


async def test_a_replaced_interpreter_fools_shared_mode_and_not_a_separate_verifier(
    tmp_path, backend, sandbox_for, evil_so
):
    # The limit docs/design.md states: test.sh's own interpreter is the image's, the agent's.
    task_dir = _attack_task(tmp_path, "replace_bash", evil_so)
    shared = load_task(task_dir)
    sb = await sandbox_for(shared)
    await _run_attack(sb, task_dir)
    fooled = await run_verifier(sb, shared)
    assert (fooled.reward_valid, fooled.reward) == (True, 1.0), fooled
    # The same attack against the task in separate mode: a fresh sandbox gets only the artifact.
    toml = task_dir / "task.toml"
    toml.write_text(
        'artifacts = ["/app/hello.txt"]\n' + toml.read_text() + "\n[verifier.environment]\ncpus = 1\n"
    )
    separate = load_task(task_dir)
    agent = await sandbox_for(separate)
    await _run_attack(agent, task_dir)
    done = await verify_separately(
        backend, agent, separate, trial_id="replace-bash", artifacts_dir=tmp_path / "a"
    )
    assert (done.result.reward_valid, done.result.reward) == (True, 0.0), done.result


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client) -> TrialflowSettings:
    return worker_settings("harness", temporal_address, s3_endpoint, docker_client, max_concurrent_trials=3)


@pytest.mark.temporal
@pytest.mark.s3
async def test_every_attack_gets_the_honest_reward_through_the_worker(
    tmp_path, client, settings, worker, evil_so, no_leaked_sandboxes
):
    tasks = [_attack_task(tmp_path, attack, evil_so) for attack in EXPECTED]
    specs = batch.make_specs(f"harness-{uuid.uuid4().hex[:6]}", tasks, "oracle", attempt_limit=2)
    results = await batch.run(client, specs, task_queue=settings.task_queue)
    store = open_store(settings)
    by_attack = {}
    for attack, spec, result in zip(EXPECTED, specs, results, strict=True):
        by_attack[attack] = (result.reward, result.reward_valid, result.termination_reason, result.attempts)
        keys = TrialKeys(spec.batch_id, spec.trial_id, result.attempts)
        assert result.verifier_trust == "harness", (attack, result)
        if attack == "break_restart":  # the verifier never ran: the restart failed on the agent's files
            assert "could not be started again" in store.get_bytes(keys.log("verifier/stderr.txt")).decode()
            continue
        alive = store.get_bytes(keys.log("verifier/files/processes.txt")).decode().split("\n")
        # Only the engine's init, the toolchain's keep-alive and test.sh's own bash.
        argv0 = {line.split(" ", 1)[1] for line in alive if line}
        assert argv0 <= {"/sbin/docker-init", BUSYBOX, "/bin/bash"}, (attack, alive)
        env = store.get_bytes(keys.log("verifier/files/env.txt")).decode()
        assert "BASH_ENV" not in env and "LD_PRELOAD" not in env and "PATH=" in env, (attack, env)
        assert store.get_bytes(keys.log("verifier/files/preload.txt")) == b"absent\n", attack
    expected = {attack: (reward, True) for attack, reward in EXPECTED.items()}
    assert {a: got[:2] for a, got in by_attack.items()} == expected, by_attack
    # The sandbox the agent stopped is its outcome, on the first attempt: never infra_error.
    for attack, (_, _, termination, attempts) in by_attack.items():
        assert termination != "infra_error" and attempts == 1, (attack, by_attack[attack])
    assert by_attack["kill_keepalive"][2] == "scaffold_error", by_attack
    assert by_attack["solve_then_die"][2] == "scaffold_error", by_attack
