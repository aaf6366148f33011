"""Container hardening (SandboxPolicy) against the real engine: pids limit, capabilities,
no-new-privileges, read-only root with writable dirs, the storage limit's support check."""

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox import seccomp
from trialflow.sandbox.docker import docker_create_options
from trialflow.sandbox.policy import SandboxPolicy
from trialflow.tasks import load_task
from trialflow.verifier import run_verifier

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


# Attach to a child, read its memory, make a user namespace: every call must fail with EPERM.
TAMPER = """
import ctypes, ctypes.util, errno, os, subprocess, time
libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
child = subprocess.Popen(["sleep", "60"])
time.sleep(0.2)
out = {}
out["ptrace_attach"] = libc.ptrace(16, child.pid, None, None)  # PTRACE_ATTACH
out["ptrace_errno"] = errno.errorcode.get(ctypes.get_errno())
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(8)
local, remote = iovec(ctypes.cast(buf, ctypes.c_void_p), 8), iovec(0x400000, 8)
libc.process_vm_readv.restype = ctypes.c_ssize_t
out["vm_readv"] = libc.process_vm_readv(child.pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
out["vm_readv_errno"] = errno.errorcode.get(ctypes.get_errno())
out["unshare"] = libc.unshare(0x10000000)  # CLONE_NEWUSER
out["unshare_errno"] = errno.errorcode.get(ctypes.get_errno())
r = subprocess.run(["python3", "-c", "import os; os.fork()"], capture_output=True)
out["fork_still_works"] = r.returncode
child.kill()
print(out)
"""


def test_seccomp_profile_denies_tampering_and_allows_the_rest():
    prof = seccomp.profile()
    assert prof["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in prof["syscalls"] if "args" not in rule for n in rule["names"]}  # type: ignore[attr-defined]
    assert {"ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "bpf", "mount", "unshare"} <= denied
    assert not denied & {"read", "write", "clone", "execve", "wait4", "kill"}
    assert seccomp.profile_json() == seccomp.profile_json()  # cached, stable text


async def test_ptrace_and_process_vm_are_denied_in_the_sandbox(sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    res = await sb.exec(["python3", "-c", TAMPER], timeout_s=60)
    assert res.ok, res
    seen = eval(res.stdout)  # noqa: S307 (our own script's dict literal)
    assert seen["ptrace_attach"] == -1 and seen["ptrace_errno"] == "EPERM", seen
    assert seen["vm_readv"] == -1 and seen["vm_readv_errno"] == "EPERM", seen
    assert seen["unshare"] == -1 and seen["unshare_errno"] == "EPERM" and seen["fork_still_works"] == 0, seen


async def test_the_engine_default_profile_allows_ptrace(make_backend):
    # The control: without trialflow's profile the same attach succeeds (issue 20's attack).
    backend = make_backend(policy=SandboxPolicy(seccomp_profile=False))
    sb = await backend.create(load_task(EXAMPLES / "create-file"), trial_id="test-engine-seccomp")
    try:
        await sb.start()
        res = await sb.exec(["python3", "-c", TAMPER], timeout_s=60)
        assert res.ok, res
        assert eval(res.stdout)["ptrace_attach"] == 0, res.stdout  # noqa: S307
    finally:
        await sb.stop()


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
    assert opts["security_opt"][0] == "no-new-privileges:true"
    assert opts["security_opt"][1] == f"seccomp={seccomp.profile_json()}"
    assert "security_opt" not in docker_create_options(
        SandboxPolicy(no_new_privileges=False, seccomp_profile=False), workdir=None, storage_mb=None
    )
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
    # The verification restart marks its state volume through the same API on a read-only root.
    assert (await sb.exec(f"echo 'Hello, trialflow!' > {workdir}/hello.txt")).ok
    verdict = await run_verifier(sb, task)
    assert (verdict.reward_valid, verdict.reward) == (True, 1.0), verdict


def test_storage_limit_support_is_detected(backend, caplog):
    supported = backend._supports_storage_quota()
    info = backend.client.info()
    fs = dict(tuple(kv) for kv in info.get("DriverStatus") or [] if len(kv) == 2).get("Backing Filesystem")
    assert supported == (info.get("Driver") == "overlay2" and fs == "xfs")
