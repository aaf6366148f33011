"""Harbor's runtime semantics on the real Docker engine (issue 13): the image's ENTRYPOINT
runs with Harbor's keep-alive arguments, an entrypoint that exits is refused at start,
the healthcheck gates set-up, limits apply only where the task sets them.

Tasks are written here (tmp dirs), FROM the local `trialflow-base:bookworm`."""

from __future__ import annotations

import json
from pathlib import Path

import docker.errors
import pytest

from trialflow.errors import EntrypointExited, HealthcheckFailed
from trialflow.healthcheck import run_healthcheck
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker


def _task(root: Path, dockerfile: str, toml: str = "", files: dict[str, str] | None = None) -> Path:
    for rel, text in {
        "task.toml": toml,
        "instruction.md": "Look around.\n",
        "environment/Dockerfile": dockerfile,
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        **(files or {}),
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


ENTRY = """#!/bin/sh
# starts a "service" (a marker and a background process), then hands over to the command
echo started-by-entrypoint > /run/service-ready
sleep 1000 &
exec "$@"
"""


async def test_entrypoint_runs_with_harbor_keepalive_args(tmp_path, sandbox_for):
    root = _task(
        tmp_path / "entry",
        "FROM trialflow-base:bookworm\nCOPY entry.sh /entry.sh\nRUN chmod +x /entry.sh\n"
        'ENTRYPOINT ["/entry.sh"]\nCMD ["echo", "cmd is replaced"]\n',
        files={"environment/entry.sh": ENTRY},
    )
    sb = await sandbox_for(load_task(root))
    res = await sb.exec(
        "cat /run/service-ready; cat /proc/1/cmdline /proc/*/cmdline 2>/dev/null | tr '\\0' ' '"
    )
    assert res.ok and "started-by-entrypoint" in res.stdout
    assert "sleep infinity" in res.stdout  # what Harbor passes the entrypoint
    assert "cmd is replaced" not in res.stdout


async def test_entrypoint_that_exits_is_refused_at_start(tmp_path, backend):
    root = _task(
        tmp_path / "dies",
        'FROM trialflow-base:bookworm\nENTRYPOINT ["sh", "-c", "echo no-db-config >&2; exit 7"]\n',
    )
    sb = await backend.create(load_task(root), trial_id="dies")
    try:
        with pytest.raises(EntrypointExited, match="code 7.*no-db-config"):
            await sb.start()
    finally:
        await sb.stop()


async def test_no_limits_unless_the_task_sets_them(tmp_path, sandbox_for, docker_client):
    free = await sandbox_for(load_task(_task(tmp_path / "free", "FROM trialflow-base:bookworm\n")))
    capped = await sandbox_for(
        load_task(
            _task(
                tmp_path / "capped",
                "FROM trialflow-base:bookworm\n",
                "[environment]\nmemory_mb = 300\ncpus = 1\n",
            )
        )
    )
    hc_free = docker_client.api.inspect_container(free.container_id)["HostConfig"]
    hc_capped = docker_client.api.inspect_container(capped.container_id)["HostConfig"]
    assert (hc_free["Memory"], hc_free["NanoCpus"]) == (0, 0)
    assert (hc_capped["Memory"], hc_capped["NanoCpus"]) == (300 << 20, 10**9)


async def test_healthcheck_gates_on_a_service_the_entrypoint_starts(tmp_path, sandbox_for):
    slow = '#!/bin/sh\n(sleep 2; touch /run/up) &\nexec "$@"\n'
    toml = (
        '[environment.healthcheck]\ncommand = "test -f /run/up"\n'
        "interval_sec = 0.5\nstart_period_sec = 1\nstart_interval_sec = 0.2\nretries = 10\n"
    )
    root = _task(
        tmp_path / "hc",
        'FROM trialflow-base:bookworm\nCOPY e.sh /e.sh\nRUN chmod +x /e.sh\nENTRYPOINT ["/e.sh"]\n',
        toml,
        files={"environment/e.sh": slow},
    )
    task = load_task(root)
    sb = await sandbox_for(task)

    async def one(cmd: str, t: float):
        return await sb.exec(["sh", "-c", cmd], timeout_s=t)

    tries = await run_healthcheck(task.config.environment.healthcheck, one)
    assert tries > 1 and (await sb.exec("test -f /run/up")).ok
    never = task.config.environment.healthcheck.model_copy(
        update={"command": "exit 3", "retries": 2, "start_period_sec": 0, "interval_sec": 0.1}
    )
    with pytest.raises(HealthcheckFailed, match="2 consecutive retries.*exit code 3"):
        await run_healthcheck(never, one)


def _public_state(client, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


async def test_public_python_image_has_a_local_stand_in(tmp_path, sandbox_for, docker_client):
    """Offline, FROM python:3.13-slim builds from trialflow's stand-in (trixie, Python 3.13,
    pip allowed system-wide, the host CA bundle so pip's TLS through the registry proxy
    works), named trialflow-standin/python:3.13-slim; python:3.13-slim itself is left as it was."""
    before = _public_state(docker_client, "python:3.13-slim")
    root = _task(
        tmp_path / "py",
        "FROM python:3.13-slim\nRUN pip install -q --no-deps six && python -c 'import six'\n",
    )
    task = load_task(root)
    sb = await sandbox_for(task)
    res = await sb.exec("python --version && pip --version && python -c 'import six; print(six.__name__)'")
    assert res.ok, res.stderr
    assert "Python 3.13" in res.stdout and "six" in res.stdout
    assert _public_state(docker_client, "python:3.13-slim") == before
    labels = docker_client.images.get(task.image_tag).labels
    assert json.loads(labels["trialflow.standins"]) == {
        "python:3.13-slim": "trialflow-standin/python:3.13-slim"
    }
    assert (root / "environment/Dockerfile").read_text().startswith("FROM python:3.13-slim\n")  # untouched


async def test_ubuntu_stand_in_and_unknown_images(tmp_path, sandbox_for, backend, docker_client):
    from trialflow.errors import ImageUnavailable

    before = _public_state(docker_client, "ubuntu:24.04")
    sb = await sandbox_for(
        load_task(_task(tmp_path / "u", "FROM ubuntu:24.04\nRUN apt-get --version >/dev/null\n"))
    )
    assert "trixie" in (await sb.exec("cat /etc/os-release")).stdout
    assert _public_state(docker_client, "ubuntu:24.04") == before  # never (re)tagged
    assert _public_state(docker_client, "trialflow-standin/ubuntu:24.04") is not None
    unknown = load_task(_task(tmp_path / "x", "FROM registry.example.org/private/env:7\n"))
    with pytest.raises(ImageUnavailable, match="no stand-in"):
        await backend.create(unknown, trial_id="x")


def test_public_image_table():
    from trialflow.sandbox.base_image import public_image

    assert public_image("python:3.11-slim").suite == "bookworm"
    assert public_image("python:3.13-slim-bookworm").suite == "trixie"
    assert public_image("python:3.12").python is True
    assert public_image("ghcr.io/laude-institute/t-bench/python-3-13:20250620").python
    assert public_image("ghcr.io/laude-institute/t-bench/ubuntu-24-04:latest").suite == "trixie"
    assert public_image("ubuntu:24.04").python is False
    assert public_image("debian:12-slim").suite == "bookworm"
    assert public_image("alpine:3.20") is None and public_image("python:2.7") is None


async def test_artifacts_are_collected_as_harbor_does(tmp_path, sandbox_for):
    from trialflow.artifacts import collect_artifacts

    toml = (
        'artifacts = ["/app/out.txt", "/nope",\n'
        '  { source = "/var/log/app", destination = "logs/app", exclude = ["*.tmp"] }]\n'
    )
    root = _task(tmp_path / "art", "FROM trialflow-base:bookworm\n", toml)
    task = load_task(root)
    sb = await sandbox_for(task)
    setup = (
        "mkdir -p /app /var/log/app/sub /logs/artifacts && echo result > /app/out.txt && "
        "echo a > /var/log/app/a.log && echo t > /var/log/app/x.tmp && echo s > /var/log/app/sub/s.log && "
        "echo conv > /logs/artifacts/agent-notes.md"
    )
    assert (await sb.exec(setup, user="0")).ok
    manifest = await collect_artifacts(sb, task.config.artifact_entries(), tmp_path / "out")
    assert [(r["source"], r["status"], r["files"]) for r in manifest] == [
        ("/logs/artifacts", "ok", 1),
        ("/app/out.txt", "ok", 1),
        ("/nope", "missing", 0),
        ("/var/log/app", "ok", 2),
    ]
    out = tmp_path / "out"
    assert (out / "logs/artifacts/agent-notes.md").read_text() == "conv\n"
    assert (out / "app/out.txt").read_text() == "result\n"
    assert sorted(p.relative_to(out / "logs/app").as_posix() for p in (out / "logs/app").rglob("*.*")) == [
        "a.log",
        "sub/s.log",
    ]


async def test_test_sh_runs_by_its_shebang(tmp_path, sandbox_for):
    """Harbor executes tests/test.sh directly: a python shebang works, executable bit or not."""
    from trialflow.verifier import run_verifier

    script = (
        "#!/usr/bin/env python3\nfrom pathlib import Path\n"
        "Path('/logs/verifier/reward.txt').write_text('0.75')\n"
    )
    root = _task(tmp_path / "py-test", "FROM trialflow-base:bookworm\n", files={"tests/test.sh": script})
    (root / "tests/test.sh").chmod(0o644)
    task = load_task(root)
    result = await run_verifier(await sandbox_for(task), task)
    assert result.reward_valid and result.rewards == {"reward": 0.75}, (result.reason, result.stderr)
    assert (root / "tests/test.sh").stat().st_mode & 0o111 == 0  # the task's own file is untouched
