"""The backend-neutral test suite every sandbox backend inherits (`SandboxContract`).

It states the contract of `trialflow.sandbox.base` (the `Sandbox` / `SandboxBackend` ABCs and
their docstrings) as tests, through the ABCs alone: nothing here knows how a backend works
(no engine API, no container inspection), so a new backend (Kubernetes pods) proves itself by
subclassing it and providing one fixture:

    sandbox_backend     a fresh `SandboxBackend` whose `reap(0)` reaches only sandboxes
                        it made (its own labels), closed by the fixture after the test

What the suite holds every backend to:
- lifecycle: `create` gives a sandbox that does not run yet, `start` runs it (idempotent),
  `stop` removes it (idempotent, also on a never-started sandbox), `attach` reaches the
  same sandbox and raises `SandboxLost` once it is gone, and the backend's `reap(0)`
  afterwards finds nothing left; `reap` removes a leaked one;
- exec: exit codes as data (string through bash, argv, a missing binary), env/user/workdir
  and the task's environment, invalid UTF-8 replaced, a timeout killing the command's
  process group (`timed_out`, a command exiting 124 by itself is not one);
- files: upload/download layout (file -> dir/basename, a directory's contents), modes,
  `SandboxPathNotFound`, links out of the tree skipped, setuid cleared, `OutputBudgetExceeded`
  against an allowance;
- network: no interface but loopback, and the listener served into the sandbox
  (`listen_loopback`) as its only way out (the host's loopback unreachable);
- processes: `stop_processes` ends what the agent started and keeps the sandbox;
  `restart_for_verification` ends everything (also after the agent killed the keep-alive),
  keeps the files and cuts the listeners served before; `base_environment` is the engine's,
  not what the agent exports; the harness's busybox is there, read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import AsyncIterator, Callable

import pytest

from tests.trialflow.conftest import EXAMPLES, fixture_task
from trialflow.errors import OutputBudgetExceeded, SandboxLost, SandboxPathNotFound
from trialflow.sandbox import Sandbox, SandboxBackend
from trialflow.sandbox.toolchain import BUSYBOX
from trialflow.sandbox.transfer import Allowance
from trialflow.tasks import Task, load_task

CREATE_FILE = EXAMPLES / "create-file"
# What a process in the sandbox sees when it dials 127.0.0.1:PORT (python3 is in the base image).
CONNECT = """
import socket, sys
s = socket.socket(); s.settimeout(3)
try:
    s.connect(("127.0.0.1", int(sys.argv[1]))); s.sendall(b"ping"); print("got", s.recv(16).decode())
except OSError as e:
    print("refused", type(e).__name__)
"""
# tests/integrity/harness_attacks/kill_keepalive.sh: the agent ends the sandbox's keep-alive
KILL_KEEPALIVE = (
    "kill -9 1; for p in /proc/[0-9]*; do "
    '[ "$(cat $p/comm 2>/dev/null)" = sleep ] && kill -9 "${p#/proc/}"; done; sleep 5'
)
PROCESSES = "for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null | tr '\\0' ' '; echo; done"


async def _serve_pong(sock: socket.socket) -> asyncio.AbstractServer:
    async def pong(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(4)
        writer.write(b"pong")
        await writer.drain()
        writer.close()

    return await asyncio.start_server(pong, sock=sock)


async def _until(sb: Sandbox, check: str, timeout_s: float = 30) -> None:
    """Until `check` succeeds in `sb` (a background command has got going)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (await sb.exec(check)).ok:
        assert asyncio.get_running_loop().time() < deadline, f"never true in the sandbox: {check}"
        await asyncio.sleep(0.05)


class SandboxContract:
    """Subclass it with a `sandbox_backend` fixture (see the module docstring)."""

    @pytest.fixture
    async def made(self, sandbox_backend: SandboxBackend) -> AsyncIterator[Callable]:
        """`await made(task, start=True)` -> a sandbox of this test, stopped at teardown;
        then the backend must hold none of them any more (`reap(0)` finds nothing)."""
        sandboxes: list[Sandbox] = []

        async def make(task: Task | None = None, *, start: bool = True, **kwargs) -> Sandbox:
            task = task or load_task(CREATE_FILE)
            sb = await sandbox_backend.create(task, trial_id=f"contract-{task.name}", **kwargs)
            sandboxes.append(sb)
            if start:
                await sb.start()
            return sb

        yield make
        for sb in sandboxes:
            await sb.stop()
        left = await sandbox_backend.reap(0)
        assert left.removed == [] and left.failed == {}, f"stop() left sandboxes behind: {left}"

    # -- lifecycle -------------------------------------------------------------------------
    async def test_lifecycle_create_start_attach_stop(self, sandbox_backend, made):
        sb = await made(start=False)
        assert not await sb.is_running()  # created, not running
        await sb.start()
        await sb.start()  # idempotent
        assert await sb.is_running()
        await sb.exec("echo state > /tmp/s")
        again = await sandbox_backend.attach(sb.id)
        assert again.id == sb.id and (await again.exec("cat /tmp/s")).stdout == "state\n"
        await sb.stop()
        await sb.stop()  # idempotent
        await again.stop()  # the other handle to the same, now absent, sandbox
        with pytest.raises(SandboxLost):
            await again.exec("true")
        with pytest.raises(SandboxLost):
            await sb.is_running()
        with pytest.raises(SandboxLost):
            await sandbox_backend.attach(sb.id)

    async def test_a_never_started_sandbox_stops_and_leaves_nothing(self, sandbox_backend, made):
        sb = await made(start=False)
        await sb.stop()
        with pytest.raises(SandboxLost):
            await sandbox_backend.attach(sb.id)

    async def test_reap_removes_a_leaked_sandbox(self, sandbox_backend, made):
        sb = await made()
        report = await sandbox_backend.reap(0)  # as after a worker crash: never stopped
        assert report.removed == [sb.id], report  # reported by the id `attach` takes
        with pytest.raises(SandboxLost):
            await sandbox_backend.attach(sb.id)

    # -- exec ------------------------------------------------------------------------------
    async def test_exit_codes_are_data(self, made):
        sb = await made()
        res = await sb.exec("echo out; echo err >&2; exit 3")
        assert (res.exit_code, res.stdout, res.stderr, res.timed_out, res.ok) == (
            3,
            "out\n",
            "err\n",
            False,
            False,
        )
        argv = await sb.exec(["printf", "%s|", "a b", "$HOME"])  # argv: no shell
        assert argv.ok and argv.stdout == "a b|$HOME|"
        missing = await sb.exec(["/no/such/binary"])
        assert missing.exit_code != 0 and not missing.timed_out
        garbled = await sb.exec("printf 'a\\377b'")
        assert garbled.stdout == "a\ufffdb"

    async def test_env_user_workdir_and_the_tasks_environment(self, made):
        sb = await made(load_task(fixture_task("limits")))
        res = await sb.exec('echo "$GREETING $FROM_HOST $EXTRA $(pwd) $(id -un)"', env={"EXTRA": "x"})
        assert res.stdout == "hello fallback x /work root\n"
        res = await sb.exec("echo $(pwd) $(id -un)", user="nobody", workdir="/tmp")
        assert res.stdout == "/tmp nobody\n"

    async def test_a_timeout_kills_the_process_group(self, made):
        sb = await made()
        res = await sb.exec("sleep 301 & sleep 302; echo never", timeout_s=1.0)
        assert res.timed_out and not res.ok and "never" not in res.stdout
        assert res.duration_s >= 1.0
        ps = await sb.exec(PROCESSES)
        assert "sleep 301" not in ps.stdout and "sleep 302" not in ps.stdout
        own = await sb.exec("exit 124", timeout_s=30)  # its own 124 is not a timeout
        assert own.exit_code == 124 and not own.timed_out
        unbounded = await sb.exec("sleep 1.5; echo done", timeout_s=None)
        assert unbounded.ok and unbounded.stdout == "done\n"

    # -- files -----------------------------------------------------------------------------
    async def test_upload_download_layout_and_modes(self, tmp_path, made):
        sb = await made()
        src = tmp_path / "src"
        (src / "sub").mkdir(parents=True)
        (src / "run.sh").write_text("#!/bin/sh\necho hi\n")
        (src / "run.sh").chmod(0o755)
        (src / "sub" / "data.bin").write_bytes(bytes(range(256)) * 10)
        await sb.upload(src, "/dst/deep")  # a directory's contents, the target made
        res = await sb.exec(
            "/dst/deep/run.sh && stat -c %a /dst/deep/run.sh && wc -c < /dst/deep/sub/data.bin"
        )
        assert res.stdout.split() == ["hi", "755", "2560"]
        await sb.upload(src / "run.sh", "/single")  # a file: remote_dir/<basename>
        assert (await sb.exec("test -x /single/run.sh")).ok

        back = await sb.download("/dst/deep", tmp_path / "back")
        assert back == tmp_path / "back"
        assert (back / "sub" / "data.bin").read_bytes() == (src / "sub" / "data.bin").read_bytes()
        assert os.access(back / "run.sh", os.X_OK)
        one = await sb.download("/single/run.sh", tmp_path / "one")
        assert one == tmp_path / "one" / "run.sh" and one.read_text() == "#!/bin/sh\necho hi\n"

    async def test_file_errors_are_typed(self, tmp_path, made):
        sb = await made()
        with pytest.raises(SandboxPathNotFound):
            await sb.download("/no/such/path", tmp_path / "x")
        with pytest.raises(FileNotFoundError):
            await sb.upload(tmp_path / "absent", "/x")

    async def test_download_refuses_what_the_agent_planted(self, tmp_path, made):
        sb = await made()
        planted = await sb.exec(
            "mkdir -p /out && echo ok > /out/kept && ln -s /etc/passwd /out/abs && "
            "ln -s ../../../../etc/passwd /out/up && cp /bin/true /out/suid && chmod 4755 /out/suid"
        )
        assert planted.ok, planted
        back = await sb.download("/out", tmp_path / "out")
        assert (back / "kept").read_text() == "ok\n"
        for name in ("abs", "up"):  # would land (or point) outside local_dir: skipped
            assert not (back / name).is_symlink() and not (back / name).exists(), name
        suid = back / "suid"
        assert suid.exists() and not suid.stat().st_mode & (stat.S_ISUID | stat.S_ISGID)

    async def test_download_is_charged_to_its_allowance(self, tmp_path, made):
        sb = await made()
        assert (await sb.exec("mkdir -p /big && head -c 5000 /dev/zero > /big/a && echo x > /big/b")).ok
        with pytest.raises(OutputBudgetExceeded):
            await sb.download("/big", tmp_path / "big", allowance=Allowance("artifacts", 1000, 10))
        allowance = Allowance("artifacts", 10_000, 10)
        await sb.download("/big", tmp_path / "fits", allowance=allowance)
        assert allowance.used_bytes == 5002 and (tmp_path / "fits" / "b").read_text() == "x\n"

    # -- network ---------------------------------------------------------------------------
    async def test_its_listener_is_the_only_way_out(self, made):
        sb = await made()
        links = await sb.exec("ls /sys/class/net; cat /proc/net/route | wc -l")
        assert links.stdout.split() == ["lo", "1"], links  # loopback only, no route
        inside = await sb.listen_loopback()
        host = socket.socket()
        host.bind(("127.0.0.1", 0))
        host.listen(4)
        host.setblocking(False)
        servers = [await _serve_pong(inside), await _serve_pong(host)]
        try:
            port_in, port_host = inside.getsockname()[1], host.getsockname()[1]
            ok = await sb.exec(["python3", "-c", CONNECT, str(port_in)], timeout_s=30)
            assert ok.stdout.strip() == "got pong", ok
            if port_host != port_in:  # the host's loopback is not the sandbox's
                blocked = await sb.exec(["python3", "-c", CONNECT, str(port_host)], timeout_s=30)
                assert blocked.stdout.startswith("refused"), blocked
        finally:
            for server in servers:
                server.close()
                await server.wait_closed()

    # -- processes -------------------------------------------------------------------------
    async def test_stop_processes_ends_what_the_agent_started(self, made):
        sb = await made()
        started = await sb.exec(
            "setsid nohup sleep 1001 >/dev/null 2>&1 & (sleep 1002 &); echo ok", timeout_s=30
        )
        assert started.ok
        await _until(sb, f"{PROCESSES} | grep -q '[s]leep 1001' && {PROCESSES} | grep -q '[s]leep 1002'")
        assert await sb.stop_processes() >= 2
        after = await sb.exec(PROCESSES)
        assert "sleep 1001" not in after.stdout and "sleep 1002" not in after.stdout
        assert await sb.is_running() and (await sb.exec("true")).ok  # the sandbox itself lives

    async def test_restart_for_verification_keeps_files_ends_the_rest(self, made):
        sb = await made()
        inside = await sb.listen_loopback()
        server = await _serve_pong(inside)
        try:
            assert (await sb.exec("echo left > /tmp/by-agent; setsid nohup sleep 1003 >/dev/null 2>&1 &")).ok
            await _until(sb, f"{PROCESSES} | grep -q '[s]leep 1003'")
            await sb.restart_for_verification()
            assert await sb.is_running()
            assert (await sb.exec("cat /tmp/by-agent")).stdout == "left\n"
            assert "sleep 1003" not in (await sb.exec(PROCESSES)).stdout
            cut = await sb.exec(["python3", "-c", CONNECT, str(inside.getsockname()[1])], timeout_s=30)
            assert cut.stdout.startswith("refused"), cut  # the earlier listener reaches it no more
        finally:
            server.close()
            await server.wait_closed()

    async def test_restart_for_verification_after_the_agent_stopped_it(self, made):
        sb = await made()
        assert (await sb.exec("echo left > /tmp/by-agent")).ok
        with contextlib.suppress(SandboxLost):  # the exec may go down with its sandbox
            await sb.exec(KILL_KEEPALIVE, user="0", timeout_s=30)
        deadline = asyncio.get_running_loop().time() + 30
        while await sb.is_running():  # stopped, its files kept
            assert asyncio.get_running_loop().time() < deadline, "the sandbox outlived its keep-alive"
            await asyncio.sleep(0.1)
        await sb.restart_for_verification()
        assert await sb.is_running()
        assert (await sb.exec("cat /tmp/by-agent")).stdout == "left\n"

    async def test_base_environment_is_the_engines(self, made):
        sb = await made(load_task(fixture_task("limits")))
        env = await sb.base_environment()
        assert env["GREETING"] == "hello" and env["FROM_HOST"] == "fallback"
        await sb.exec("export GREETING=rewritten; echo 'export GREETING=rewritten' >> /etc/profile")
        assert (await sb.base_environment())["GREETING"] == "hello"

    async def test_the_harness_busybox_is_there_read_only(self, made):
        sb = await made()
        assert (await sb.exec([BUSYBOX, "true"])).ok
        write = await sb.exec(f"echo x > {BUSYBOX}", user="0")
        assert write.exit_code != 0
