"""One Docker container as a `Sandbox`: exec, upload, download, stop (lifecycle in
`trialflow.sandbox.base`; create sandboxes through `DockerBackend`).

Exec timeouts are enforced from the host: at the deadline the exec's process, its
descendants and its process group are killed by host pid (`processes.exec_tree`; exit 137),
so no binary inside the sandbox (a planted `timeout`) decides when a command ends. If the
output stream stays open past the deadline plus a grace period (a daemonized child holding
stdout), the exec is abandoned and reported as timed out with empty output. Each stream keeps its last
`output_cap` bytes (`_TailBuffer`). Downloads are streamed and charged to an allowance
(`trialflow.sandbox.transfer`; by default the backend's log limits). Engine errors that mean the container is gone (404,
409 "not running", engine unreachable) become `SandboxLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import socket
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar

import docker.errors
import docker.utils
import requests.exceptions

from trialflow.errors import (
    EntrypointExited,
    SandboxLost,
    SandboxPathNotFound,
    SandboxRestartFailed,
    SandboxStartFailed,
)
from trialflow.sandbox import processes, toolchain
from trialflow.sandbox.base import ExecResult, Sandbox
from trialflow.sandbox.netns import listen_in_netns
from trialflow.sandbox.reaper import LABEL_POD_OF, LABEL_POD_ROLE, LABEL_VERIFIER_OF
from trialflow.sandbox.transfer import Allowance, extract_stream

if TYPE_CHECKING:
    from trialflow.sandbox.docker import DockerBackend
    from trialflow.sandbox.pod import DockerPod

T = TypeVar("T")


class _TailBuffer:
    """Keeps the last `cap` bytes of a stream and counts what was dropped."""

    def __init__(self, cap: int) -> None:
        self.cap, self.dropped, self.size = cap, 0, 0
        self.chunks: deque[bytes] = deque()

    def add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)
        while self.size - len(self.chunks[0]) >= self.cap:
            gone = self.chunks.popleft()
            self.size -= len(gone)
            self.dropped += len(gone)

    def text(self) -> str:
        data = b"".join(self.chunks)
        if len(data) > self.cap:
            self.dropped += len(data) - self.cap
            data = data[-self.cap :]
        body = data.decode("utf-8", errors="replace")
        return f"[trialflow: {self.dropped} earlier bytes truncated]\n{body}" if self.dropped else body


def _tar_local(local: Path) -> IO[bytes]:
    """`local` as a tar archive in an unnamed temporary file (streamed to the engine from
    there: an upload of artifacts is never held in memory)."""
    buf = tempfile.TemporaryFile()

    def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with tarfile.open(fileobj=buf, mode="w") as tar:
        if local.is_dir():
            for child in sorted(local.iterdir()):
                tar.add(child, arcname=child.name, filter=as_root)
        else:
            tar.add(local, arcname=local.name, filter=as_root)
    buf.seek(0)
    return buf


class DockerSandbox(Sandbox):
    """A container managed by `DockerBackend`. Create it through the backend. `pod`: a
    compose task's services, started around it by `start` (trialflow.sandbox.pod); a
    sandbox found again by `attach` has none (its services are already running)."""

    def __init__(
        self,
        backend: DockerBackend,
        container_id: str,
        name: str,
        pod: DockerPod | None = None,
        local_names: tuple[str, ...] = (),
    ) -> None:
        self._backend = backend
        self._cid = container_id
        self._name = name
        self._stopped = False
        self._pod = pod
        self._local_names = local_names

    @property
    def id(self) -> str:
        return self._name

    @property
    def local_names(self) -> tuple[str, ...]:
        return self._local_names

    @property
    def container_id(self) -> str:
        return self._cid

    def __repr__(self) -> str:
        return f"DockerSandbox({self._name!r})"

    async def _call(self, fn: Callable[[], T]) -> T:
        try:
            return await self._backend._run(fn)
        except docker.errors.NotFound as e:
            raise SandboxLost(f"sandbox {self._name} no longer exists: {e}") from e
        except docker.errors.APIError as e:
            if e.status_code == 409:  # "container ... is not running"
                raise SandboxLost(f"sandbox {self._name} is not running: {e}") from e
            raise
        except requests.exceptions.ConnectionError as e:
            raise SandboxLost(f"docker engine unreachable while using {self._name}: {e}") from e

    async def start(self) -> None:
        if self._pod is not None:
            await self._pod.start(self._start_main)
        else:
            await self._start_main()

    async def _start_main(self) -> None:
        api = self._backend.client.api
        try:
            state = await self._call(lambda: api.inspect_container(self._cid)["State"])
            if not state.get("Running"):
                await self._call(lambda: api.start(self._cid))
        except SandboxLost:
            raise
        except docker.errors.APIError as e:
            raise SandboxStartFailed(f"could not start sandbox {self._name}: {e}") from e
        # The image's ENTRYPOINT runs first (as in Harbor); one that exits takes the
        # container with it. A first exec gives it a moment and proves the sandbox answers.
        try:
            ready = await self.exec(toolchain.tool("true"), timeout_s=60)
        except (SandboxLost, docker.errors.APIError):  # exited meanwhile: 409 or 500 "is not running"
            ready = None
        state = await self._call(lambda: api.inspect_container(self._cid)["State"])
        if not state.get("Running"):
            logs = await self._call(lambda: api.logs(self._cid, tail=20).decode("utf-8", "replace"))
            raise EntrypointExited(
                f"sandbox {self._name}: the image's ENTRYPOINT exited with code {state.get('ExitCode')} "
                f"before the agent could start (Harbor runs it with `sh -c 'sleep infinity'` as its "
                f'arguments; an entrypoint script should end in `exec "$@"`)'
                + (f"; its last output: {logs.strip()[-500:]}" if logs.strip() else "")
            )
        if ready is None or not ready.ok:
            raise SandboxStartFailed(f"sandbox {self._name} does not run commands: {ready}")

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        t0 = time.monotonic()
        api = self._backend.client.api
        exec_id = await self._call(
            lambda: api.exec_create(
                self._cid,
                argv,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                environment=dict(env) if env else None,
                user="" if user is None else str(user),
                workdir=workdir,
            )["Id"]
        )
        run = asyncio.ensure_future(self._call(lambda: self._exec_blocking(exec_id)))
        try:
            if timeout_s is None:
                code, out, err = await run
                return ExecResult(code, out, err, False, time.monotonic() - t0)
            try:
                code, out, err = await asyncio.wait_for(asyncio.shield(run), timeout_s)
                return ExecResult(code, out, err, False, time.monotonic() - t0)
            except TimeoutError:
                pass
            await self._kill_exec(exec_id)
            grace = self._backend.exec_grace_s
            try:
                code, out, err = await asyncio.wait_for(asyncio.shield(run), grace)
            except TimeoutError:
                return ExecResult(
                    exit_code=137,
                    stdout="",
                    timed_out=True,
                    duration_s=time.monotonic() - t0,
                    stderr=f"[trialflow: output stream still open {grace:g}s after the timeout "
                    f"(a background process kept it open); exec abandoned]",
                )
            return ExecResult(code, out, err, True, time.monotonic() - t0)
        except asyncio.CancelledError:
            # No in-sandbox timeout would ever end it: the caller gave up, so it ends now.
            await asyncio.shield(self._kill_exec(exec_id))
            raise

    async def _kill_exec(self, exec_id: str) -> None:
        """SIGKILL an exec's process tree by host pid (a few sweeps: it may be forking)."""
        api = self._backend.client.api
        try:
            info = await self._call(lambda: api.exec_inspect(exec_id))
        except (SandboxLost, docker.errors.APIError):
            return  # the container (and with it the exec) is gone
        pid = info.get("Pid") or 0
        if not info.get("Running") or pid <= 0:
            return

        def sweep() -> int:
            try:
                procs = processes.cgroup_procs_file(pid)
                return processes.kill_pids(processes.exec_tree(pid, procs))
            except OSError:
                return 0  # it ended meanwhile

        for _ in range(20):
            if not await self._backend._run(sweep):
                return
            await asyncio.sleep(0.01)

    def _exec_blocking(self, exec_id: str) -> tuple[int, str, str]:
        api = self._backend.client.api
        out, err = _TailBuffer(self._backend.output_cap), _TailBuffer(self._backend.output_cap)
        for o, e in api.exec_start(exec_id, stream=True, demux=True):
            if o:
                out.add(o)
            if e:
                err.add(e)
        code = api.exec_inspect(exec_id)["ExitCode"]
        return (-1 if code is None else code), out.text(), err.text()

    async def upload(self, local_path: str | Path, remote_dir: str) -> None:
        local = Path(local_path)
        if not await asyncio.to_thread(local.exists):
            raise FileNotFoundError(f"upload source does not exist: {local}")
        # The toolchain's mkdir: the sandbox's own may be the agent's.
        mk = await self.exec(toolchain.tool("mkdir", "-p", remote_dir), user="0", timeout_s=60)
        if not mk.ok:
            raise SandboxLost(f"mkdir -p {remote_dir} failed in {self._name}: {mk.stderr.strip()}")
        api = self._backend.client.api
        with await self._backend._run(lambda: _tar_local(local)) as data:
            await self._call(lambda: api.put_archive(self._cid, remote_dir, data))

    async def download(
        self, remote_path: str, local_dir: str | Path, *, allowance: Allowance | None = None
    ) -> Path:
        dest = Path(local_dir)
        api = self._backend.client.api
        budget = allowance if allowance is not None else self._backend.limits.logs(f"copy of {remote_path}")

        def fetch() -> Path:
            # The archive endpoint by hand: docker's get_archive hides the response, which
            # must be closed when the budget runs out, so that the engine stops sending.
            res = api._get(
                api._url("/containers/{0}/archive", self._cid), params={"path": remote_path}, stream=True
            )
            try:
                try:
                    api._raise_for_status(res)
                except docker.errors.NotFound as e:
                    if "No such container" in str(e):
                        raise
                    raise SandboxPathNotFound(f"{remote_path} does not exist in {self._name}") from e
                stat = docker.utils.decode_json_header(res.headers["X-Docker-Container-Path-Stat"])
                is_dir = bool(stat["mode"] & (1 << 31))  # Go's os.ModeDir
                # Docker's archive has the basename as top entry: stripped for directories.
                extract_stream(
                    res.iter_content(1 << 16), dest, strip_top=is_dir, allowance=budget, where=remote_path
                )
            finally:
                res.close()
            return dest if is_dir else dest / stat["name"]

        return await self._call(fetch)

    async def _init_pid(self) -> int:
        """Host pid of the container's init; SandboxLost when it is not running."""
        state = await self._call(lambda: self._backend.client.api.inspect_container(self._cid)["State"])
        pid = state.get("Pid") or 0
        if not state.get("Running") or pid <= 0:
            raise SandboxLost(f"sandbox {self._name} is not running")
        return pid

    async def listen_loopback(self) -> socket.socket:
        pid = await self._init_pid()
        try:
            return await self._backend._run(lambda: listen_in_netns(pid))
        except OSError as e:
            raise SandboxLost(f"could not listen inside sandbox {self._name}: {e}") from e

    async def stop_processes(self) -> int:
        """See `trialflow.sandbox.processes`: freeze, SIGKILL all but the keep-alive by host
        pid, thaw, sweep again until the cgroup holds only the keep-alive."""
        pid = await self._init_pid()
        try:
            procs = await self._backend._run(lambda: processes.cgroup_procs_file(pid))
            keep = await self._backend._run(lambda: processes.keep_alive_pids(pid))
        except OSError as e:
            raise SandboxLost(f"cannot see the processes of sandbox {self._name}: {e}") from e

        def sweep() -> int:
            return processes.kill_pids(processes.cgroup_pids(procs) - keep)

        frozen = await self._backend._run(lambda: processes.freezer(pid))
        if frozen is not None:
            await self._backend._run(lambda: frozen[0].write_bytes(frozen[1]))
        try:
            killed = await self._backend._run(sweep)
        finally:
            if frozen is not None:
                await self._backend._run(lambda: frozen[0].write_bytes(frozen[2]))
        for _ in range(100):
            left = await self._backend._run(lambda: processes.cgroup_pids(procs) - keep)
            if not left:
                return killed
            killed += await self._backend._run(functools.partial(processes.kill_pids, left))
            await asyncio.sleep(0.02)
        raise SandboxLost(f"sandbox {self._name}: processes survived SIGKILL: {sorted(left)[:10]}")

    async def is_running(self) -> bool:
        state = await self._call(lambda: self._backend.client.api.inspect_container(self._cid)["State"])
        return bool(state.get("Running"))

    async def base_environment(self) -> dict[str, str]:
        env = await self._call(lambda: self._backend.client.api.inspect_container(self._cid)["Config"]["Env"])
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env or [])

    async def restart_for_verification(self) -> None:
        """SIGKILL the container's init (the kernel then kills every process of its pid
        namespace: the keep-alive, anything that attached to it, any daemon), mark the state
        volume from the host, start it again: the launcher now execs the toolchain's sleep
        (`trialflow.sandbox.toolchain`). Also for a container the agent stopped. Raises
        SandboxLost (gone, engine unreachable) or SandboxRestartFailed (the engine answered
        but could not start it from the files the agent left)."""
        api = self._backend.client.api

        def kill() -> None:
            if api.inspect_container(self._cid)["State"].get("Running"):
                try:
                    api.kill(self._cid, signal="SIGKILL")
                except docker.errors.APIError as e:
                    if e.status_code != 409:  # 409: it stopped meanwhile
                        raise
                api.wait(self._cid, timeout=60)

        try:
            await self._call(kill)
        except requests.exceptions.ReadTimeout as e:
            raise SandboxLost(f"sandbox {self._name} did not stop: {e}") from e
        # Written while no process of the sandbox exists, so nothing of the agent's can
        # undo it; a marker the agent planted itself only asks for this same mode.
        try:
            await self._call(lambda: api.put_archive(self._cid, toolchain.STATE_DIR, _marker_tar()))
        except docker.errors.APIError as e:
            raise SandboxRestartFailed(f"sandbox {self._name}: cannot mark {toolchain.STATE_DIR}: {e}") from e
        try:
            await self._call(lambda: api.start(self._cid))
        except SandboxLost:
            raise
        except docker.errors.APIError as e:
            raise SandboxRestartFailed(f"sandbox {self._name} could not be started again: {e}") from e
        ready = None
        with contextlib.suppress(SandboxLost, docker.errors.APIError):
            ready = await self.exec(toolchain.tool("true"), timeout_s=60)
        if ready is None or not ready.ok:
            raise SandboxRestartFailed(
                f"sandbox {self._name} does not run commands after its restart: {ready}"
            )

    async def stop(self) -> None:
        """Removes the container, any separate verifier made for it that is still there
        (one whose verification was cut short: the worker died mid-verify), and a compose
        task's services and namespace holder: services, main, then the holder."""
        if self._stopped:
            return
        api = self._backend.client.api

        def labelled(label: str) -> list[dict]:
            return api.containers(all=True, filters={"label": f"{label}={self._name}"})

        try:
            children = await self._backend._run(lambda: labelled(LABEL_VERIFIER_OF))
            pod = await self._backend._run(lambda: labelled(LABEL_POD_OF))
            services = [c for c in pod if c["Labels"].get(LABEL_POD_ROLE) != "holder"]
            holders = [c for c in pod if c["Labels"].get(LABEL_POD_ROLE) == "holder"]
            for child in [*children, *services]:
                await self._backend._run(functools.partial(_remove, api, child["Id"]))
            await self._backend._run(functools.partial(_remove, api, self._cid))
            for holder in holders:
                await self._backend._run(functools.partial(_remove, api, holder["Id"]))
        except docker.errors.APIError as e:
            raise SandboxLost(f"could not remove sandbox {self._name}: {e}") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxLost(f"docker engine unreachable while removing {self._name}: {e}") from e
        self._stopped = True


def _marker_tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        body = b"the verification restart\n"
        info = tarfile.TarInfo(toolchain.VERIFY_MARKER)
        info.size, info.mode = len(body), 0o644
        tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def _remove(api: docker.APIClient, container_id: str) -> None:
    """Force-remove a container and its anonymous volumes; an absent one, or one whose
    removal is already under way, counts as removed."""
    try:
        api.remove_container(container_id, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as e:
        if e.status_code != 409 or "already in progress" not in str(e):
            raise
