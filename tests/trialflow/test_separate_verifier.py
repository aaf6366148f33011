"""The separate verifier environment on the real Docker engine (issue 13): a fresh sandbox
built from tests/ (or the agent's image), isolated like every sandbox, that receives the
task's artifacts and nothing else from the agent's sandbox, runs test.sh as Harbor runs it
there, and is removed afterwards (or with the agent's sandbox, should verification never
get to it). The adversarial tests plant what an agent under training would.

Tasks are written here (tmp dirs) FROM the local `trialflow-base:bookworm`, except the
sample task examples/tasks/separate-verifier."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox import toolchain
from trialflow.sandbox.reaper import LABEL_VERIFIER_OF
from trialflow.separate_verifier import verify_separately
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker

SAMPLE = EXAMPLES / "separate-verifier"

# Records what the verifier sees into /logs/verifier/facts.json, then grades /app/out.txt.
FACTS_TEST = r"""#!/bin/bash
planted=()
for f in /etc/planted /tmp/planted /app/planted /logs/agent/planted /grader/planted; do
  [ -e "$f" ] && planted+=("$f")
done
arts=$(cd /logs/artifacts 2>/dev/null && find . -mindepth 1 | sort | tr '\n' ' ')
cat > /logs/verifier/facts.json <<JSON
{"user": "$(id -un)", "pwd": "$(pwd)", "mode": "${MODE:-}", "grader": "${GRADER:-}",
 "nets": "$(ls /sys/class/net | tr '\n' ' ')", "planted": "${planted[*]}",
 "artifacts": "$arts", "daemons": "$(pgrep -fc 'sleep 0.05' || true)",
 "cmp": "$(sha256sum /usr/bin/cmp | cut -c1-16)", "tests": "$(ls /tests | tr '\n' ' ')"}
JSON
if cmp -s /app/out.txt /tests/expected.txt; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""

TOML = """artifacts = ["/app/out.txt", "/app/data"]

[verifier]
user = "nobody"
env = {{ MODE = "strict" }}
timeout_sec = 60
{mode}
[environment]
workdir = "/app"
{verifier_env}"""


def _task(root: Path, *, own_image: bool, toml_extra: str = "") -> Path:
    if own_image:
        toml = TOML.format(
            mode="",
            verifier_env='\n[verifier.environment]\nworkdir = "/grader"\nenv = { GRADER = "yes" }\n',
        )
    else:
        toml = TOML.format(mode='environment_mode = "separate"\n', verifier_env="")
    files = {
        "task.toml": toml + toml_extra,
        "instruction.md": "Write /app/out.txt.\n",
        "environment/Dockerfile": "FROM trialflow-base:bookworm\nRUN mkdir -p /app /tests\n"
        "RUN echo from-the-image > /tests/expected.txt\n",
        "tests/test.sh": FACTS_TEST,
    }
    if own_image:
        files["tests/Dockerfile"] = (
            "FROM trialflow-base:bookworm\nCOPY test.sh expected.txt /tests/\nRUN mkdir -p /grader /app\n"
        )
        files["tests/expected.txt"] = "the answer\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


async def _verify(backend, agent, task, tmp: Path):
    return await verify_separately(
        backend, agent, task, trial_id="sv", artifacts_dir=tmp / "artifacts", log_dir=tmp / "logs"
    )


def _facts(tmp: Path) -> dict:
    return json.loads((tmp / "logs" / "facts.json").read_text())


def _verifiers(docker_client, agent) -> list:
    return docker_client.containers.list(all=True, filters={"label": f"{LABEL_VERIFIER_OF}={agent.id}"})


async def test_sample_task_passes_and_fails(tmp_path, backend, sandbox_for, docker_client):
    task = load_task(SAMPLE)
    solved = await sandbox_for(task)
    await solved.upload(task.solution_dir, "/solution")
    assert (await solved.exec("bash /solution/solve.sh", timeout_s=30)).ok
    ok = await _verify(backend, solved, task, tmp_path / "ok")
    assert (ok.result.reward_valid, ok.result.reward) == (True, 1.0), ok.result
    assert [r["status"] for r in ok.manifest] == ["missing", "ok"]  # /logs/artifacts, /app/report.txt
    unsolved = await sandbox_for(task)
    bad = await _verify(backend, unsolved, task, tmp_path / "bad")
    assert (bad.result.reward_valid, bad.result.reward) == (True, 0.0), bad.result
    assert "FAIL" in bad.result.stdout
    assert _verifiers(docker_client, solved) == _verifiers(docker_client, unsolved) == []


async def test_the_verifier_runs_as_harbor_runs_it(tmp_path, backend, sandbox_for):
    """Its own image and /tests, its environment's workdir and env, [verifier].user and
    .env, no network but loopback, nothing of the agent's but the artifacts."""
    task = load_task(_task(tmp_path / "own", own_image=True))
    agent = await sandbox_for(task)
    assert (
        await agent.exec(
            "mkdir -p /app/data/sub && echo a > /app/data/sub/a && echo the answer > /app/out.txt"
        )
    ).ok
    done = await _verify(backend, agent, task, tmp_path)
    assert (done.result.reward_valid, done.result.reward) == (True, 1.0), done.result
    facts = _facts(tmp_path)
    assert (facts["user"], facts["pwd"], facts["mode"], facts["grader"]) == (
        "nobody",
        "/grader",
        "strict",
        "yes",
    )
    assert facts["nets"].split() == ["lo"]
    assert facts["tests"].split() == ["expected.txt", "test.sh"]  # the verifier image's, not uploaded
    assert (tmp_path / "artifacts" / "app" / "data" / "sub" / "a").read_text() == "a\n"


async def test_the_verifier_sandbox_is_isolated_like_every_sandbox(
    tmp_path, backend, sandbox_for, docker_client
):
    task = load_task(_task(tmp_path / "own", own_image=True))
    agent = await sandbox_for(task)
    verifier = await backend.create(task, trial_id="iso", verifier_for=agent)
    try:
        info = docker_client.api.inspect_container(verifier.id)
        hc = info["HostConfig"]
        assert hc["NetworkMode"] == "none" and hc["PidsLimit"] == 1024
        assert "NET_RAW" in hc["CapDrop"] and "no-new-privileges:true" in hc["SecurityOpt"]
        # No bind mount shared with the agent's sandbox; from the host only the harness's
        # read-only toolchain, and the restart marker's own volume.
        mounts = {(m["Type"], m["Destination"], m["RW"]) for m in info["Mounts"]}
        assert mounts == {("bind", toolchain.BUSYBOX, False), ("volume", toolchain.STATE_DIR, True)}, mounts
        assert info["Config"]["Image"] == task.separate_verifier.image.tag
        assert info["Config"]["Labels"][LABEL_VERIFIER_OF] == agent.id
    finally:
        await verifier.stop()


async def test_an_agent_cannot_reach_the_verifier_but_through_the_artifacts(tmp_path, backend, sandbox_for):
    """Everything an agent might try from its sandbox: rewards planted where the verifier
    writes, a daemon still writing them, a forged test.sh and grader tools, files planted
    outside the artifact paths, symlinks in the artifacts pointing at the verifier's own
    files. The verifier sees none of it and grades the agent's real (wrong) answer 0."""
    task = load_task(_task(tmp_path / "own", own_image=True))
    agent = await sandbox_for(task)
    attack = r"""
set -e
mkdir -p /logs/verifier /logs/artifacts /logs/agent /app/data
echo 1 > /logs/verifier/reward.txt; echo '{"reward": 1}' > /logs/verifier/reward.json
printf '#!/bin/sh\necho 1 > /logs/verifier/reward.txt\n' > /tests/test.sh; chmod +x /tests/test.sh
printf '#!/bin/sh\nexit 0\n' > /usr/bin/cmp
for f in /etc/planted /tmp/planted /logs/agent/planted; do echo x > $f; done
mkdir -p /grader && echo x > /grader/planted
ln -s /tests/expected.txt /app/out.txt                    # "my answer is the expected one"
ln -s /logs/verifier /logs/artifacts/abs                  # links out of the artifacts
ln -s ../verifier/reward.txt /logs/artifacts/rel
ln -s ../../tests/expected.txt /app/data/up
echo note > /logs/artifacts/note.txt
setsid nohup bash -c 'while :; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done' >/dev/null 2>&1 &
"""
    assert (await agent.exec(attack, user="0", timeout_s=30)).ok
    done = await _verify(backend, agent, task, tmp_path)
    assert (done.result.reward_valid, done.result.reward) == (True, 0.0), done.result
    assert done.result.files == {"reward.txt": "0\n"}
    facts = _facts(tmp_path)
    assert facts["planted"] == "" and facts["tests"].split() == ["expected.txt", "test.sh"]
    assert facts["artifacts"].split() == ["./note.txt"]  # the links stayed behind
    assert facts["daemons"] == "0"
    rows = {r["source"]: r["status"] for r in done.manifest}
    assert rows == {"/logs/artifacts": "ok", "/app/out.txt": "failed", "/app/data": "ok"}
    # The daemon is gone from the agent's sandbox too (killed before anything was copied).
    left = await agent.exec(["pgrep", "-fc", "sleep 0.05"])
    assert left.stdout.strip() == "0"


async def test_a_step_before_the_last_leaves_the_agents_processes_running(tmp_path, backend, sandbox_for):
    """Harbor's MultiStepTrial stops the agent's environment before a separate verifier only
    on the last step: before an earlier one (`stop_agent=False`) the next step continues in
    it, services and all. The verifier still sees nothing of the agent's processes."""
    task = load_task(_task(tmp_path / "own", own_image=True))
    agent = await sandbox_for(task)
    daemon = "setsid nohup bash -c 'while :; do sleep 0.05; done' >/dev/null 2>&1 &"
    assert (await agent.exec(f"echo the answer > /app/out.txt && {daemon}", user="0")).ok
    done = await verify_separately(
        backend, agent, task, trial_id="sv", artifacts_dir=tmp_path / "artifacts", log_dir=tmp_path / "logs",
        stop_agent=False,
    )  # fmt: skip
    assert (done.result.reward_valid, done.result.reward) == (True, 1.0), done.result
    assert _facts(tmp_path)["daemons"] == "0"
    assert (await agent.exec(["pgrep", "-fc", "sleep 0.05"])).stdout.strip() != "0"


async def test_a_fresh_sandbox_of_the_agents_image_sees_none_of_its_changes(tmp_path, backend, sandbox_for):
    """environment_mode = "separate" without an image of its own: the agent's image, fresh;
    tests/ uploaded (replacing the image's /tests); a replaced tool stays in the agent's."""
    task = load_task(_task(tmp_path / "same", own_image=False))
    assert not task.separate_verifier.bundled_tests
    agent = await sandbox_for(task)
    attack = (
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/bin/cmp && echo x > /etc/planted && echo wrong > /app/out.txt"
    )
    assert (await agent.exec(attack, user="0")).ok
    done = await _verify(backend, agent, task, tmp_path)
    assert (done.result.reward_valid, done.result.reward) == (True, 0.0), done.result
    facts = _facts(tmp_path)
    assert facts["planted"] == "" and facts["tests"].split() == ["test.sh"]
    genuine = await agent.exec("sha256sum /usr/bin/cmp | cut -c1-16")
    assert facts["cmp"] != genuine.stdout.strip()  # the verifier's cmp is the image's


async def test_a_verifier_left_behind_goes_with_the_agents_sandbox(tmp_path, backend, docker_client):
    """A worker that dies mid-verification leaves its verifier sandbox; the trial's
    teardown (stopping the agent's sandbox) removes it; the reaper catches both anyway."""
    task = load_task(SAMPLE)
    agent = await backend.create(task, trial_id="orphan")
    await agent.start()
    verifier = await backend.create(task, trial_id="orphan-verifier", verifier_for=agent)
    await verifier.start()
    assert len(_verifiers(docker_client, agent)) == 1
    await agent.stop()
    assert _verifiers(docker_client, agent) == []
    again = await backend.create(task, trial_id="reaped")
    await backend.create(task, trial_id="reaped-verifier", verifier_for=again)
    report = await backend.reap(0)
    assert len(report.removed) == 2 and not report.failed


async def test_a_broken_verifier_image_fails_set_up(tmp_path, backend):
    """The verifier's image is built with the agent's (set-up), so a broken one costs no
    agent run: ImageBuildFailed before any sandbox exists."""
    from trialflow.errors import ImageBuildFailed

    root = _task(tmp_path / "broken", own_image=True)
    (root / "tests" / "Dockerfile").write_text(
        "FROM trialflow-base:bookworm\nRUN echo grader-build-broken && exit 3\n"
    )
    with pytest.raises(ImageBuildFailed, match=r"\(verifier\)"):
        await backend.create(load_task(root), trial_id="broken")


async def test_the_shared_verifier_refuses_a_separate_task(sandbox_for):
    from trialflow.verifier import run_verifier

    task = load_task(SAMPLE)
    with pytest.raises(ValueError, match="separate verifier environment"):
        await run_verifier(await sandbox_for(task), task)


async def test_the_verifier_phase_gets_its_own_network_mode(tmp_path, backend, sandbox_for):
    """`[verifier] network_mode = "allowlist"`: the verifier sandbox (not the agent's) gets
    the egress proxy to the allowed host (a local server on 127.0.0.2 standing in for an
    index); the proxy is closed with the sandbox."""
    from tests.trialflow.sandbox.test_egress import _index
    from trialflow.sandbox.egress import Egresses

    runner, port = await _index("127.0.0.2")
    try:
        root = _task(tmp_path / "net", own_image=True)
        toml = (root / "task.toml").read_text()
        (root / "task.toml").write_text(
            toml.replace(
                "[verifier]\n", '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["127.0.0.2"]\n'
            )
        )
        (root / "tests" / "test.sh").write_text(
            '#!/bin/bash\npython3 -c "import urllib.request as u; '
            f"print(u.urlopen('http://127.0.0.2:{port}/simple/', timeout=5).read().decode())\" "
            "> /logs/verifier/got.txt 2>&1; echo 1 > /logs/verifier/reward.txt\n"
        )
        task = load_task(root)
        agent = await sandbox_for(task)
        egresses = Egresses()
        done = await verify_separately(
            backend,
            agent,
            task,
            trial_id="net",
            artifacts_dir=tmp_path / "a",
            log_dir=tmp_path / "l",
            egresses=egresses,
        )
        assert done.result.reward_valid, done.result
        assert (tmp_path / "l" / "got.txt").read_text().strip() == "index on 127.0.0.2"
        assert len(egresses) == 0  # closed with the verifier sandbox
        no_net = await agent.exec(
            ["python3", "-c", f"import socket; socket.create_connection(('127.0.0.2', {port}), 2)"]
        )
        assert not no_net.ok  # the agent's phase stays without a network
    finally:
        await runner.cleanup()


async def test_a_verifier_image_whose_entrypoint_exits_is_a_task_error(
    tmp_path, backend, sandbox_for, docker_client
):
    """The verifier image's ENTRYPOINT runs as the agent's does; one that exits is the task's
    fault (EntrypointExited, not retried: the trial ends as verifier_error) and its sandbox
    is removed all the same."""
    from trialflow.errors import EntrypointExited

    root = _task(tmp_path / "dies", own_image=True)
    dockerfile = root / "tests" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text() + 'ENTRYPOINT ["sh", "-c", "echo grader-misconfigured >&2; exit 4"]\n'
    )
    task = load_task(root)
    agent = await sandbox_for(task)
    with pytest.raises(EntrypointExited, match="code 4.*grader-misconfigured"):
        await _verify(backend, agent, task, tmp_path)
    assert _verifiers(docker_client, agent) == []
