"""Container hardening (SandboxPolicy) against the real engine: pids limit, capabilities,
no-new-privileges, read-only root with writable dirs, the storage limit's support check."""

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox.docker import docker_create_options
from trialflow.sandbox.policy import SandboxPolicy
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker

CAP_NET_RAW_BIT = 13
FORK_1500 = """
import os, signal, time
kids, error = [], "none"
for _ in range(1500):
    try:
        pid = os.fork()
    except OSError as e:
        error = type(e).__name__
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print(len(kids), error)
"""


def _cap_eff(status: str) -> int:
    line = next(line for line in status.splitlines() if line.startswith("CapEff:"))
    return int(line.split()[1], 16)


def test_policy_rejects_nonsense():
    with pytest.raises(ValueError, match="too small"):
        SandboxPolicy(pids_limit=3)
    with pytest.raises(ValueError, match="absolute"):
        SandboxPolicy(writable_dirs=("tmp",))


def test_create_options_are_pure_and_complete():
    opts = docker_create_options(SandboxPolicy(), workdir="/app", storage_mb=None)
    assert opts["pids_limit"] == 1024
    assert opts["security_opt"] == ["no-new-privileges:true"]
    assert "NET_RAW" in opts["cap_drop"] and "read_only" not in opts and opts["mounts"] == []
    ro = docker_create_options(
        SandboxPolicy(read_only_root=True, runtime="runsc", pids_limit=None), workdir="/app", storage_mb=512
    )
    assert ro["read_only"] is True and ro["runtime"] == "runsc" and "pids_limit" not in ro
    assert ro["storage_opt"] == {"size": "512M"}
    assert "/app" in [m["Target"] for m in ro["mounts"]]


async def test_default_sandbox_is_hardened(sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    status = await sb.exec("cat /proc/self/status")
    assert status.ok
    assert not _cap_eff(status.stdout) & (1 << CAP_NET_RAW_BIT), "NET_RAW must be dropped"
    assert "NoNewPrivs:\t1" in status.stdout
    # Forking past the limit fails inside the sandbox (the host is untouched).
    bomb = await sb.exec(["python3", "-c", FORK_1500], timeout_s=120)
    assert bomb.ok, bomb
    forked, error = bomb.stdout.split(maxsplit=1)
    assert 900 < int(forked) < 1024 and "BlockingIOError" in error, bomb.stdout


async def test_read_only_root_keeps_work_dirs_writable(make_backend):
    backend = make_backend(policy=SandboxPolicy(read_only_root=True))
    task = load_task(EXAMPLES / "create-file")
    sb = await backend.create(task, trial_id="test-read-only")
    try:
        await sb.start()
        await _check_read_only(sb, task)
    finally:
        await sb.stop()


async def _check_read_only(sb, task):
    root = await sb.exec("touch /usr/forbidden", user="0")
    assert not root.ok and "Read-only" in root.stderr
    workdir = task.config.environment.workdir or "/app"
    ok = await sb.exec(f"touch {workdir}/x /tmp/x /logs/x && echo fine", user="0")
    assert ok.ok, ok
    # upload/download use the engine's archive API: they must reach the writable dirs.
    await sb.upload(task.tests_dir, "/tests")
    listed = await sb.exec("ls /tests")
    assert "test.sh" in listed.stdout


def test_storage_limit_support_is_detected(backend, caplog):
    supported = backend._supports_storage_quota()
    info = backend.client.info()
    fs = dict(tuple(kv) for kv in info.get("DriverStatus") or [] if len(kv) == 2).get("Backing Filesystem")
    assert supported == (info.get("Driver") == "overlay2" and fs == "xfs")
