"""Docker backend for the Sandbox ABCs (see `trialflow.sandbox.base` for the lifecycle).

Images: each task's environment/ is built once per content hash and tagged
`trialflow-task:<env_hash[:32]>` (`Task.image_tag`); a second `create()` for the same
environment is a cache hit (`ImageInfo.built is False`). Builds use host networking (no
bridge exists here) and never pull (`FROM` must name a local image such as
`trialflow-base:bookworm`, which the backend makes first when it is missing: see
`DockerBackend(base_images=...)`). `[environment].build_timeout_sec` bounds the build; a task
with `docker_image` uses that local image as is (`ImageUnavailable` when it is absent).
Changing a base image does not change task hashes: remove `trialflow-task:*` images then.

Containers: `network_mode="host"`, `init=True` (zombie reaping), kept alive by
`sleep infinity`; limits from task.toml (`nano_cpus` = cpus clamped to the host's CPUs,
`mem_limit` = memory_mb with no extra swap). `storage_mb` is not enforced: overlay2 needs
an xfs backing filesystem with pquota for `storage_opt`. Labels on every container:
`trialflow.managed=true`, `trialflow.trial_id`, `trialflow.created_at` (unix seconds),
`trialflow.task`, `trialflow.env_hash`, plus the caller's. Container names are
`tf-<trial_id slug>-<8 hex>`: retries of `create()` never collide.

Exec timeouts run the command under coreutils `timeout -s KILL` inside the container (kills
the command's process group; exit 137). If the output stream stays open past the deadline
plus a grace period (a daemonized child holding stdout), the exec is abandoned on the host
side and reported as timed out with empty output. Blocking SDK calls run on the backend's
own thread pool, not asyncio's default one, so long agent execs cannot starve other calls.

Task images must provide `sleep` and `timeout` (coreutils or busybox), plus `bash` for
string commands; every image built `FROM trialflow-base:bookworm` has them.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import re
import shlex
import tarfile
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions
import urllib3.exceptions

from trialflow.errors import (
    BaseImageUnavailable,
    ImageBuildFailed,
    ImageBuildTimeout,
    ImageUnavailable,
    SandboxLost,
    SandboxPathNotFound,
    SandboxStartFailed,
)
from trialflow.sandbox.base import (
    ExecResult,
    ImageInfo,
    Mount,
    ReapReport,
    Sandbox,
    SandboxBackend,
)
from trialflow.sandbox.reaper import (
    LABEL_CREATED_AT,
    LABEL_MANAGED,
    LABEL_TRIAL_ID,
    reap_containers,
)

if TYPE_CHECKING:
    from trialflow.tasks import Task

log = logging.getLogger(__name__)

T = TypeVar("T")
EXEC_GRACE_S = 30.0  # host-side slack past an in-container timeout before abandoning
DEFAULT_OUTPUT_CAP = 4 << 20  # bytes kept per stream (tail)
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_FROM = re.compile(r"^\s*FROM\s+(?:--\S+\s+)*(\S+)", re.IGNORECASE | re.MULTILINE)


def dockerfile_bases(text: str) -> list[str]:
    """Images named by the FROM lines of a Dockerfile, in order (flags like --platform skipped)."""
    return _FROM.findall(text)


def _ensure_trialflow_base(client: docker.DockerClient) -> object:
    from infra.base_image import (
        ensure_base_image,  # lazy: debootstrap tooling only when needed
    )

    return ensure_base_image(client)


DEFAULT_BASE_IMAGES: dict[str, Callable[[docker.DockerClient], object]] = {
    "trialflow-base:bookworm": _ensure_trialflow_base,
}


def resolve_env(env: Mapping[str, str], host_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Expand Harbor's `${VAR}` / `${VAR:-default}` in task env values from the host env.
    An unset `${VAR}` without a default becomes the empty string."""
    host = os.environ if host_env is None else host_env

    def sub(m: re.Match[str]) -> str:
        val = host.get(m.group(1))
        return val if val else (m.group(2) or "")

    return {k: _ENV_REF.sub(sub, v) for k, v in env.items()}


def _slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:limit] or "trial"


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


def _tar_local(local: Path) -> io.BytesIO:
    buf = io.BytesIO()

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
    """A container managed by `DockerBackend`. Create it through the backend."""

    def __init__(self, backend: DockerBackend, container_id: str, name: str) -> None:
        self._backend = backend
        self._cid = container_id
        self._name = name
        self._stopped = False

    @property
    def id(self) -> str:
        return self._name

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
        api = self._backend.client.api
        try:
            state = await self._call(lambda: api.inspect_container(self._cid)["State"])
            if not state.get("Running"):
                await self._call(lambda: api.start(self._cid))
        except SandboxLost:
            raise
        except docker.errors.APIError as e:
            raise SandboxStartFailed(f"could not start sandbox {self._name}: {e}") from e

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
        if timeout_s is not None:
            # coreutils `timeout` takes fractional seconds; KILL because TERM can be trapped.
            argv = ["timeout", "-s", "KILL", f"{max(timeout_s, 0.001):.3f}", *argv]
        t0 = time.monotonic()
        blocking = lambda: self._exec_blocking(argv, env, user, workdir)
        try:
            if timeout_s is None:
                code, out, err = await self._call(blocking)
            else:
                grace = self._backend.exec_grace_s
                code, out, err = await asyncio.wait_for(self._call(blocking), timeout_s + grace)
        except TimeoutError:
            return ExecResult(
                exit_code=137,
                stdout="",
                timed_out=True,
                duration_s=time.monotonic() - t0,
                stderr=f"[trialflow: output stream still open {grace:g}s after the timeout "
                f"(a background process kept it open); exec abandoned]",
            )
        duration = time.monotonic() - t0
        timed_out = timeout_s is not None and code in (124, 137) and duration >= timeout_s
        return ExecResult(code, out, err, timed_out, duration)

    def _exec_blocking(
        self, argv: list[str], env: Mapping[str, str] | None, user: str | int | None, workdir: str | None
    ) -> tuple[int, str, str]:
        api = self._backend.client.api
        ex = api.exec_create(
            self._cid,
            argv,
            stdout=True,
            stderr=True,
            stdin=False,
            tty=False,
            environment=dict(env) if env else None,
            user="" if user is None else str(user),
            workdir=workdir,
        )
        out, err = _TailBuffer(self._backend.output_cap), _TailBuffer(self._backend.output_cap)
        for o, e in api.exec_start(ex["Id"], stream=True, demux=True):
            if o:
                out.add(o)
            if e:
                err.add(e)
        code = api.exec_inspect(ex["Id"])["ExitCode"]
        return (-1 if code is None else code), out.text(), err.text()

    async def upload(self, local_path: str | Path, remote_dir: str) -> None:
        local = Path(local_path)
        if not local.exists():
            raise FileNotFoundError(f"upload source does not exist: {local}")
        mk = await self.exec(["mkdir", "-p", remote_dir], user="0")
        if not mk.ok:
            raise SandboxLost(f"mkdir -p {remote_dir} failed in {self._name}: {mk.stderr.strip()}")
        data = await self._backend._run(lambda: _tar_local(local))
        api = self._backend.client.api
        await self._call(lambda: api.put_archive(self._cid, remote_dir, data.getvalue()))

    async def download(self, remote_path: str, local_dir: str | Path) -> Path:
        dest = Path(local_dir)
        api = self._backend.client.api

        def fetch() -> Path:
            try:
                stream, stat = api.get_archive(self._cid, remote_path)
            except docker.errors.NotFound as e:
                if "No such container" in str(e):
                    raise
                raise SandboxPathNotFound(f"{remote_path} does not exist in {self._name}") from e
            is_dir = bool(stat["mode"] & (1 << 31))  # Go's os.ModeDir
            with tempfile.TemporaryFile() as tmp:
                for chunk in stream:
                    tmp.write(chunk)
                tmp.seek(0)
                dest.mkdir(parents=True, exist_ok=True)
                with tarfile.open(fileobj=tmp) as tar:
                    members = []
                    for m in tar.getmembers():
                        # Docker's archive has the basename as top entry; strip it for directories.
                        if is_dir:
                            parts = m.name.split("/", 1)
                            if len(parts) == 1:
                                continue
                            m.name = parts[1]
                            if m.islnk():  # hard links name their target by archive path
                                m.linkname = m.linkname.split("/", 1)[-1]
                        members.append(m)
                    tar.extractall(dest, members=members, filter="data")
            return dest if is_dir else dest / stat["name"]

        return await self._call(fetch)

    async def stop(self) -> None:
        if self._stopped:
            return
        try:
            await self._backend._run(
                lambda: self._backend.client.api.remove_container(self._cid, force=True, v=True)
            )
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as e:
            if e.status_code != 409 or "already in progress" not in str(e):
                raise SandboxLost(f"could not remove sandbox {self._name}: {e}") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxLost(f"docker engine unreachable while removing {self._name}: {e}") from e
        self._stopped = True


class DockerBackend(SandboxBackend):
    """Sandboxes as local Docker containers. One instance per worker process.

    `labels` are added to every container this backend creates (e.g. a worker id, which
    `reap()` then also filters on so that workers sharing an engine reap only their own).
    `base_images` maps local base image tags to a function that makes them; when a task's
    Dockerfile says `FROM` one that is missing, it is made first (once, under a lock).
    Default: `trialflow-base:bookworm` via `infra.base_image` (debootstrap, minutes on a
    fresh machine). Pass `{}` to disable. `exec_grace_s`: see the module docstring.
    """

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        labels: Mapping[str, str] | None = None,
        output_cap_bytes: int = DEFAULT_OUTPUT_CAP,
        max_threads: int = 256,
        host_env: Mapping[str, str] | None = None,
        base_images: Mapping[str, Callable[[docker.DockerClient], object]] | None = None,
        exec_grace_s: float = EXEC_GRACE_S,
    ) -> None:
        self.client = client
        self.labels = dict(labels or {})
        self.output_cap = output_cap_bytes
        self.exec_grace_s = exec_grace_s
        self._host_env = host_env
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="tf-docker")
        self._build_locks: dict[str, asyncio.Lock] = {}
        self._base_images = dict(DEFAULT_BASE_IMAGES if base_images is None else base_images)
        self._base_lock = asyncio.Lock()
        self._host_cpus: float | None = None

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        """Release the thread pool (does not touch containers)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- images ---------------------------------------------------------------------------

    async def ensure_image(self, task: Task) -> ImageInfo:
        """Build the task image unless its tag exists. Concurrent calls for one tag build once."""
        tag = task.image_tag
        lock = self._build_locks.setdefault(tag, asyncio.Lock())
        async with lock:
            t0 = time.monotonic()
            found = await self._run(lambda: self._image_id(tag))
            if found:
                return ImageInfo(tag, found, built=False, duration_s=time.monotonic() - t0)
            if task.config.environment.docker_image:
                raise ImageUnavailable(
                    f"task {task.name}: image {tag} ([environment].docker_image) is not present "
                    "locally and images cannot be pulled here"
                )
            if task.dockerfile is not None:
                await self._ensure_bases(task.dockerfile.read_text(errors="replace"))
            timeout = task.config.environment.build_timeout_sec
            try:
                tail = await asyncio.wait_for(
                    self._run(lambda: self._build_blocking(task, tag, timeout)), timeout + EXEC_GRACE_S
                )
            except TimeoutError:
                raise ImageBuildTimeout(f"task {task.name}: image build exceeded {timeout:.0f}s") from None
            image_id = await self._run(lambda: self._image_id(tag))
            if not image_id:
                raise ImageBuildFailed(f"task {task.name}: build finished but {tag} is missing", tail)
            duration = time.monotonic() - t0
            log.info("built %s for task %s in %.1fs", tag, task.name, duration)
            return ImageInfo(tag, image_id, built=True, duration_s=duration, log_tail=tail)

    async def _ensure_bases(self, dockerfile: str) -> None:
        for base in dockerfile_bases(dockerfile):
            make = self._base_images.get(base)
            if make is None:
                continue
            async with self._base_lock:
                if await self._run(lambda b=base: self._image_id(b)):
                    continue
                log.info("base image %s is missing: making it", base)
                try:
                    await self._run(lambda m=make: m(self.client))
                except Exception as e:  # debootstrap/mirror trouble: worth another attempt
                    raise BaseImageUnavailable(f"could not make base image {base}: {e}") from e

    def _image_id(self, tag: str) -> str | None:
        try:
            return self.client.images.get(tag).id
        except docker.errors.ImageNotFound:
            return None

    def _build_blocking(self, task: Task, tag: str, timeout: float) -> str:
        lines: deque[str] = deque(maxlen=60)
        t0 = time.monotonic()
        try:
            stream = self.client.api.build(
                path=str(task.environment_dir),
                tag=tag,
                network_mode="host",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                timeout=timeout,
                labels={LABEL_MANAGED: "true", "trialflow.env_hash": task.env_hash},
            )
            for chunk in stream:
                if "stream" in chunk:
                    lines.extend(chunk["stream"].rstrip("\n").splitlines())
                if "error" in chunk:
                    lines.append(chunk["error"])
                    raise ImageBuildFailed(
                        f"task {task.name}: docker build failed: {chunk['error'].strip()}", "\n".join(lines)
                    )
                if time.monotonic() - t0 > timeout:
                    stream.close()  # closing the connection makes the engine cancel the build
                    raise ImageBuildTimeout(
                        f"task {task.name}: image build exceeded {timeout:.0f}s", "\n".join(lines)
                    )
        # A silent build step hits the HTTP read timeout: from urllib3 directly while streaming.
        except (requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError):
            raise ImageBuildTimeout(
                f"task {task.name}: image build exceeded {timeout:.0f}s", "\n".join(lines)
            ) from None
        except docker.errors.APIError as e:
            raise ImageBuildFailed(f"task {task.name}: docker build rejected: {e}", "\n".join(lines)) from e
        return "\n".join(lines)

    # -- containers -----------------------------------------------------------------------

    def _cpus(self) -> float:
        if self._host_cpus is None:
            self._host_cpus = float(self.client.info().get("NCPU") or os.cpu_count() or 1)
        return self._host_cpus

    def container_labels(self, task: Task, trial_id: str, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {
            **self.labels,
            **(extra or {}),
            LABEL_MANAGED: "true",
            LABEL_TRIAL_ID: trial_id,
            LABEL_CREATED_AT: str(int(time.time())),
            "trialflow.task": task.name,
            "trialflow.env_hash": task.env_hash,
        }

    async def create(
        self,
        task: Task,
        *,
        trial_id: str,
        labels: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
    ) -> DockerSandbox:
        image = await self.ensure_image(task)
        envcfg = task.config.environment
        cpus = await self._run(self._cpus)
        if envcfg.cpus > cpus:
            log.warning("task %s asks for %s cpus; host has %s: clamped", task.name, envcfg.cpus, cpus)
        name = f"tf-{_slug(trial_id)}-{uuid.uuid4().hex[:8]}"
        kwargs = {
            "image": image.tag,
            "name": name,
            "entrypoint": ["sleep"],
            "command": ["infinity"],
            "network_mode": "host",
            "init": True,
            "detach": True,
            "labels": self.container_labels(task, trial_id, labels),
            "nano_cpus": int(min(envcfg.cpus, cpus) * 1e9),
            "mem_limit": f"{envcfg.memory_mb}m",
            "memswap_limit": f"{envcfg.memory_mb}m",
            "environment": resolve_env(envcfg.env, self._host_env),
            "working_dir": envcfg.workdir,
            "mounts": [
                docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in mounts
            ],
        }
        if envcfg.workdir is None:
            del kwargs["working_dir"]
        try:
            container = await self._run(lambda: self.client.containers.create(**kwargs))
        except docker.errors.ImageNotFound as e:
            raise ImageUnavailable(f"task {task.name}: image {image.tag} vanished: {e}") from e
        except (docker.errors.APIError, requests.exceptions.ConnectionError) as e:
            raise SandboxStartFailed(f"could not create sandbox for trial {trial_id}: {e}") from e
        return DockerSandbox(self, container.id, name)

    async def attach(self, sandbox_id: str) -> DockerSandbox:
        try:
            info = await self._run(lambda: self.client.api.inspect_container(sandbox_id))
        except docker.errors.NotFound as e:
            raise SandboxLost(f"sandbox {sandbox_id} no longer exists") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxLost(f"docker engine unreachable while attaching {sandbox_id}: {e}") from e
        if info["Config"]["Labels"].get(LABEL_MANAGED) != "true":
            raise SandboxLost(f"container {sandbox_id} is not a trialflow sandbox")
        return DockerSandbox(self, info["Id"], info["Name"].lstrip("/"))

    async def reap(self, older_than_s: float) -> ReapReport:
        return await self._run(lambda: reap_containers(self.client, older_than_s, self.labels))


def shell_join(argv: Sequence[str]) -> str:
    """Quote argv for `bash -c` (helper for scaffolds that build command lines)."""
    return shlex.join(argv)
