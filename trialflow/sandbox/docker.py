"""Docker backend for the Sandbox ABCs (see `trialflow.sandbox.base` for the lifecycle).

The backend creates, attaches and reaps containers; one container's operations are
`DockerSandbox` (`trialflow.sandbox.docker_sandbox`: exec, files, stop) and task images
are `DockerImages` (`trialflow.sandbox.docker_images`: build once per environment hash,
make missing base images).

Containers: `network_mode="none"` (`SandboxPolicy.isolate_network`), `init=True` (zombie
reaping: the engine's own init, a host binary); the harness's toolchain (the host's static
busybox) bind-mounted read-only and the launcher as ENTRYPOINT (`trialflow.sandbox.toolchain`):
at the first start the image's ENTRYPOINT runs as Harbor runs it, with `sh -c "exec sleep
infinity"` as its arguments in place of the image's CMD (`KEEPALIVE_COMMAND`), and `start()`
refuses a container whose entrypoint exited; the verification restart
(`DockerSandbox.restart_for_verification`) starts it with the toolchain's sleep instead; the
image's HEALTHCHECK is disabled (the engine would exec it in the sandbox on its own, also while
the verifier has network); limits only where task.toml sets them, as in Harbor
(`nano_cpus` = cpus clamped to the host's CPUs, `mem_limit` = memory_mb with no extra swap), hardened by the
backend's `SandboxPolicy` (`docker_create_options`: pids limit, no-new-privileges, dropped
capabilities, optional read-only root and runtime). `storage_mb` is enforced only where
overlay2 sits on xfs with project quotas (`storage_opt size`); elsewhere (ext4 here) it
is logged once as not enforced. The sandbox's one way out is a listener the worker opens
inside its network namespace (`DockerSandbox.listen_loopback`, `trialflow.sandbox.netns`).
Labels on every container:
`trialflow.managed=true`, `trialflow.trial_id`, `trialflow.created_at` (unix seconds),
`trialflow.task`, `trialflow.env_hash`, plus the caller's. Container names are
`tf-<trial_id slug>-<8 hex>`: retries of `create()` never collide. Blocking SDK calls run
on the backend's own thread pool, not asyncio's default one, so long agent execs cannot
starve other calls.

Task images must provide `sh` and `sleep` (the agent phase's keep-alive), plus `bash` for
string commands; every image built `FROM trialflow-base:bookworm` has them. Exec timeouts
are enforced from the host (`DockerSandbox.exec`), not by a `timeout` inside the sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Required, TypedDict, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions

from trialflow.compose import ComposeProject, ComposeRefused
from trialflow.errors import (
    GpusUnavailable,
    ImageUnavailable,
    SandboxLost,
    SandboxStartFailed,
    TaskEnvMissing,
    UnsupportedFeature,
)
from trialflow.sandbox import gpus, seccomp, toolchain
from trialflow.sandbox.base import ImageInfo, Mount, ReapReport, Sandbox, SandboxBackend
from trialflow.sandbox.docker_images import BaseImageMaker, DockerImages
from trialflow.sandbox.docker_sandbox import DockerSandbox
from trialflow.sandbox.image_refs import ImagePolicy
from trialflow.sandbox.pod import DockerPod
from trialflow.sandbox.policy import SandboxPolicy
from trialflow.sandbox.reaper import (
    LABEL_CREATED_AT,
    LABEL_LOCAL_NAMES,
    LABEL_MANAGED,
    LABEL_TRIAL_ID,
    LABEL_VERIFIER_OF,
    reap_containers,
)
from trialflow.sandbox.transfer import TransferLimits
from trialflow.tasks import load_task_compose, resolve_env, service_image

if TYPE_CHECKING:
    from trialflow.settings import TrialflowSettings
    from trialflow.tasks import Task

__all__ = ["DockerBackend", "DockerSandbox", "resolve_env"]

log = logging.getLogger(__name__)

T = TypeVar("T")
EXEC_GRACE_S = 30.0  # slack past an exec's timeout (its processes killed) before abandoning its stream
DEFAULT_OUTPUT_CAP = 4 << 20  # bytes kept per stream (tail)
# What Harbor's compose file gives the main service: the image's ENTRYPOINT runs (with
# this as its arguments, so an entrypoint that ends in `exec "$@"` starts its services
# and then keeps the container alive); the image's CMD is replaced. Harbor says
# `sleep infinity`; the `exec` keeps sleep the entrypoint's own process, the keep-alive
# that `stop_processes` spares (a forked sleep would be killed and the container end).
KEEPALIVE_COMMAND = ["sh", "-c", "exec sleep infinity"]


def _slug(text: str, limit: int = 40) -> str:
    return re.sub(r"[^a-zA-Z0-9_.-]+", "-", text).strip("-.")[:limit] or "trial"


class DockerBackend(SandboxBackend):
    """Sandboxes as local Docker containers. One instance per worker process.

    `labels` are added to every container this backend creates (e.g. a worker id, which
    `reap()` then also filters on so that workers sharing an engine reap only their own).
    `base_images` maps local base image tags to a function that makes them; when a task's
    Dockerfile says `FROM` one that is missing, it is made first (once, under a lock).
    Default: `trialflow-base:bookworm` via `trialflow.sandbox.base_image` (debootstrap, minutes on a
    fresh machine). Pass `{}` to disable. `images`: pull what is absent (default) or, offline,
    use trialflow's stand-ins (`trialflow.sandbox.image_refs`). `exec_grace_s`: see the module docstring.
    `toolchain`: the host's static busybox mounted into every sandbox (checked at the first
    `create`: ToolchainUnavailable when missing or dynamically linked).
    `compose_start_timeout_s`: how long a compose task's services may take to be ready
    (trialflow.sandbox.pod; ServiceStartTimeout after it).
    """

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        labels: Mapping[str, str] | None = None,
        output_cap_bytes: int = DEFAULT_OUTPUT_CAP,
        max_threads: int = 256,
        host_env: Mapping[str, str] | None = None,
        base_images: Mapping[str, BaseImageMaker] | None = None,
        exec_grace_s: float = EXEC_GRACE_S,
        policy: SandboxPolicy | None = None,
        limits: TransferLimits | None = None,
        toolchain: Path = toolchain.HOST_BUSYBOX,
        host_gpus: int | None = None,
        images: ImagePolicy | None = None,
        compose_start_timeout_s: float = 600.0,
    ) -> None:
        self.compose_start_timeout_s = compose_start_timeout_s
        self.client = client
        # budgets of downloads (trialflow.sandbox.transfer); the log limits unless a caller
        # charges a copy to an allowance of its own (artifacts)
        self.limits = limits or TransferLimits()
        self.policy = policy or SandboxPolicy()
        self.labels = dict(labels or {})
        self.output_cap = output_cap_bytes
        self.exec_grace_s = exec_grace_s
        self._host_env = host_env
        self._pool = ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="tf-docker")
        self.images = DockerImages(client, self._run, base_images, images)
        self._host_cpus: float | None = None
        self._host_gpus = host_gpus  # None: the NVIDIA driver's count, read when first needed
        self._storage_quota: bool | None = None
        self._toolchain = toolchain
        self._toolchain_checked = False
        self._entrypoints: dict[str, list[str] | None] = {}
        self._engine_id: str | None = None

    @classmethod
    def from_settings(cls, settings: TrialflowSettings, *, labels: Mapping[str, str]) -> DockerBackend:
        """The worker's backend: the engine of the environment (DOCKER_HOST or the local
        socket) with the settings' hardening, transfer limits, image policy and compose bound."""
        return cls(
            docker.from_env(),
            labels=labels,
            policy=settings.sandbox_policy(),
            limits=settings.transfer_limits(),
            images=settings.image_policy(),
            compose_start_timeout_s=settings.compose_start_timeout_s,
        )

    def ping(self) -> None:
        self.client.ping()

    async def _run(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def close(self) -> None:
        """Release the thread pool (does not touch containers)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- images ---------------------------------------------------------------------------

    async def ensure_image(self, task: Task) -> ImageInfo:
        """Build the task image unless its tag exists (see `trialflow.sandbox.docker_images`);
        with separate verifier environments (the task's, or its steps') their images too, so
        that a broken one fails set-up, before the agent runs."""
        info = await self.images.ensure(task.image)
        for image in task.verifier_images:
            await self.images.ensure(image)
        if task.compose is not None:
            await self._service_images(task, self._compose(task))
        return info

    def image_progress(self, task: Task) -> str | None:
        """What getting the task's images is doing now (a pull's layers and bytes), or None."""
        for image in (task.image, *task.verifier_images):
            if (line := self.images.progress(image.tag)) is not None:
                return line
        return None

    def _compose(self, task: Task) -> ComposeProject:
        """The task's compose file loaded with this worker's variables (strictly: a
        `${VAR?}` unset here fails set-up, as `docker compose up` would)."""
        try:
            return load_task_compose(task.path, task.config, task.image, self._host_env or os.environ)
        except ComposeRefused as e:  # a variable set here made it ask for what is refused
            raise UnsupportedFeature(
                str(task.path), [f"environment/docker-compose.yaml: {r}" for r in e.reasons]
            ) from None
        except TaskEnvMissing as e:
            raise TaskEnvMissing(f"task {task.name}: [environment].env: {e}") from None

    async def _service_images(self, task: Task, project: ComposeProject) -> dict[str, str]:
        """Each service's local image: built (once per content hash) or its `image`, got as
        a `docker_image` is (present, pulled, or offline a stand-in; main's own image, for
        `${MAIN_IMAGE_NAME}`, is present once main is built)."""
        tags = {}
        for svc in project.services:
            image = service_image(task.image.label, svc, task.config.environment.build_timeout_sec)
            tags[svc.name] = (await self.images.ensure(image)).tag
        return tags

    # -- containers -----------------------------------------------------------------------

    def _cpus(self) -> float:
        if self._host_cpus is None:
            self._host_cpus = float(self.client.info().get("NCPU") or os.cpu_count() or 1)
        return self._host_cpus

    def host_gpus(self) -> int:
        """GPUs this engine's host can give sandboxes (`trialflow.sandbox.gpus.host_gpus`)."""
        if self._host_gpus is None:
            self._host_gpus = gpus.host_gpus()
        return self._host_gpus

    def _supports_storage_quota(self) -> bool:
        """overlay2 takes `storage_opt size` only on xfs with project quotas (checked once)."""
        if self._storage_quota is None:
            info = self.client.info()
            status = dict(tuple(kv) for kv in info.get("DriverStatus") or [] if len(kv) == 2)
            self._storage_quota = (
                info.get("Driver") == "overlay2" and status.get("Backing Filesystem") == "xfs"
            )
            if not self._storage_quota and self.policy.enforce_storage:
                log.warning(
                    "sandbox storage limits are not enforced: storage driver %s on %s (overlay2 on xfs "
                    "with pquota needed)",
                    info.get("Driver"),
                    status.get("Backing Filesystem"),
                )
        return self._storage_quota

    def _image_entrypoint(self, image: ImageInfo) -> list[str] | None:
        """The image's own ENTRYPOINT (the launcher runs it at the first start), by image id."""
        if image.image_id not in self._entrypoints:
            config = self.client.api.inspect_image(image.tag)["Config"] or {}
            self._entrypoints[image.image_id] = config.get("Entrypoint") or None
        return self._entrypoints[image.image_id]

    def _toolchain_mounts(self) -> list[docker.types.Mount]:
        if not self._toolchain_checked:
            toolchain.check_host_busybox(self._toolchain)
            self._toolchain_checked = True
        return [
            docker.types.Mount(toolchain.BUSYBOX, str(self._toolchain), type="bind", read_only=True),
            # A volume: its mount point cannot be moved, and it takes the marker on a read-only root.
            docker.types.Mount(toolchain.STATE_DIR, None, type="volume"),
        ]

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
        verifier_for: Sandbox | None = None,
    ) -> DockerSandbox:
        project: ComposeProject | None = None
        if verifier_for is None:
            image = await self.ensure_image(task)
            envcfg = task.config.environment
            if task.compose is not None:
                project = self._compose(task)
        else:
            if task.separate_verifier is None:
                raise ValueError(f"task {task.name} has no separate verifier environment")
            image = await self.images.ensure(task.separate_verifier.image)
            envcfg = task.separate_verifier.config
            # The agent sandbox's teardown removes it too (DockerSandbox.stop), should the
            # verification that made it never get to.
            labels = {**(labels or {}), LABEL_VERIFIER_OF: verifier_for.id}
        try:
            environment = resolve_env(envcfg.env, self._host_env)
        except TaskEnvMissing as e:
            where = "[environment]" if verifier_for is None else "[verifier.environment]"
            raise TaskEnvMissing(f"task {task.name}: {where}.env: {e}") from None
        if project is not None:  # Harbor: task.toml's env over the compose file's main environment
            environment = {**project.main_environment, **environment}
        name = f"tf-{_slug(trial_id)}-{uuid.uuid4().hex[:8]}"
        binds = [docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only) for m in mounts]
        binds += self._toolchain_mounts()
        try:
            image_entrypoint = await self._run(lambda: self._image_entrypoint(image))
        except docker.errors.ImageNotFound as e:
            raise ImageUnavailable(f"task {task.name}: image {image.tag} vanished: {e}") from e
        entrypoint, command = toolchain.launcher(image_entrypoint, KEEPALIVE_COMMAND)
        kwargs: dict[str, object] = {
            "image": image.tag,
            "name": name,
            "entrypoint": entrypoint,
            "command": command,
            "init": True,
            "detach": True,
            "labels": self.container_labels(task, trial_id, labels),
            "environment": environment,
            "working_dir": envcfg.workdir,
            # The engine would exec the image's HEALTHCHECK in the sandbox on its own schedule,
            # also during verification with the verifier's network: a command from the files
            # the agent rewrote. Harbor gates on [environment.healthcheck], run by the harness.
            "healthcheck": {"test": ["NONE"]},
        }
        if envcfg.workdir is None:
            del kwargs["working_dir"]
        # Harbor: no limit unless the task sets one.
        cpus: float | None = None
        if envcfg.cpus is not None:
            host_cpus = await self._run(self._cpus)
            if envcfg.cpus > host_cpus:
                log.warning(
                    "task %s asks for %s cpus; host has %s: clamped", task.name, envcfg.cpus, host_cpus
                )
            cpus = min(envcfg.cpus, host_cpus)
            kwargs["nano_cpus"] = int(cpus * 1e9)
        if envcfg.memory_mb is not None:
            kwargs["mem_limit"] = kwargs["memswap_limit"] = f"{envcfg.memory_mb}m"
        if envcfg.gpus:  # Harbor: an NVIDIA device request for that many; gpu_types cannot be honoured
            where = "[environment]" if verifier_for is None else "[verifier.environment]"
            problem = gpus.gpu_problem(where, envcfg.gpus, await self._run(self.host_gpus))
            if problem is not None:
                raise GpusUnavailable(f"task {task.name}: {problem}")
            if envcfg.gpu_types:
                log.warning(
                    "task %s: gpu_types %s ignored: the engine cannot pick a GPU model",
                    task.name,
                    envcfg.gpu_types,
                )
            kwargs["device_requests"] = gpus.device_requests(envcfg.gpus)
        storage = envcfg.storage_mb if await self._run(self._supports_storage_quota) else None
        hardening = docker_create_options(self.policy, workdir=envcfg.workdir, storage_mb=storage)
        kwargs.update(hardening)
        kwargs["mounts"] = [*binds, *hardening["mounts"]]
        pod = None
        if project is not None:
            pod = await self._create_pod(task, project, name, image.tag, kwargs, storage, cpus)
            kwargs["network_mode"] = pod.network_mode
            labels_ = kwargs["labels"]
            assert isinstance(labels_, dict)
            labels_[LABEL_LOCAL_NAMES] = ",".join(project.host_names)  # read back by attach
        try:
            container = await self._run(lambda: self.client.containers.create(**kwargs))
        except BaseException as e:
            if pod is not None:
                await pod.remove()
            if isinstance(e, docker.errors.ImageNotFound):
                raise ImageUnavailable(f"task {task.name}: image {image.tag} vanished: {e}") from e
            if isinstance(e, docker.errors.APIError | requests.exceptions.ConnectionError):
                raise SandboxStartFailed(f"could not create sandbox for trial {trial_id}: {e}") from e
            raise
        return DockerSandbox(self, container.id, name, pod, project.host_names if project else ())

    async def _create_pod(
        self,
        task: Task,
        project: ComposeProject,
        name: str,
        main_image: str,
        main_kwargs: Mapping[str, Any],
        storage_mb: int | None,
        cpus: float | None,
    ) -> DockerPod:
        """A compose task's namespace holder and services (trialflow.sandbox.pod), with
        main's labels and this backend's hardening."""
        images = await self._service_images(task, project)
        labels = main_kwargs["labels"]
        assert isinstance(labels, dict)
        try:
            return await DockerPod.create(
                self,
                project,
                sandbox_name=name,
                main_image=main_image,
                images=images,
                labels=labels,
                hardening=lambda workdir: docker_create_options(
                    self.policy, workdir=workdir, storage_mb=storage_mb
                ),
                cpus=cpus,
                memory_mb=task.config.environment.memory_mb,
                start_timeout_s=self.compose_start_timeout_s,
            )
        except docker.errors.ImageNotFound as e:
            raise ImageUnavailable(f"task {task.name}: a service's image vanished: {e}") from e
        except (docker.errors.APIError, requests.exceptions.ConnectionError) as e:
            raise SandboxStartFailed(f"could not create the services of trial {name}: {e}") from e

    async def attach(self, sandbox_id: str) -> DockerSandbox:
        try:
            info = await self._run(lambda: self.client.api.inspect_container(sandbox_id))
        except docker.errors.NotFound as e:
            raise SandboxLost(f"sandbox {sandbox_id} no longer exists") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxLost(f"docker engine unreachable while attaching {sandbox_id}: {e}") from e
        if info["Config"]["Labels"].get(LABEL_MANAGED) != "true":
            raise SandboxLost(f"container {sandbox_id} is not a trialflow sandbox")
        names = info["Config"]["Labels"].get(LABEL_LOCAL_NAMES) or ""
        return DockerSandbox(
            self, info["Id"], info["Name"].lstrip("/"), local_names=tuple(n for n in names.split(",") if n)
        )

    async def reap(self, older_than_s: float) -> ReapReport:
        return await self._run(lambda: reap_containers(self.client, older_than_s, self.labels))

    async def engine_id(self) -> str | None:
        """The engine's `docker info` ID (asked once): two workers on one engine share it."""
        if self._engine_id is None:
            try:
                self._engine_id = str((await self._run(self.client.info))["ID"])
            except (docker.errors.APIError, requests.exceptions.ConnectionError, KeyError):
                return None
        return self._engine_id


class DockerCreateOptions(TypedDict, total=False):
    """The `containers.create` keyword arguments a `SandboxPolicy` sets."""

    network_mode: Required[str]
    cap_drop: Required[list[str]]
    mounts: Required[list[Any]]  # docker.types.Mount (the docker SDK has no type information)
    pids_limit: int
    security_opt: list[str]
    runtime: str
    storage_opt: dict[str, str]
    read_only: bool


def docker_create_options(
    policy: SandboxPolicy, *, workdir: str | None, storage_mb: int | None
) -> DockerCreateOptions:
    """`containers.create` keyword arguments for `policy` (pure). With a read-only root the
    writable dirs are anonymous volumes (the image's content at that path is copied in, and
    the engine's archive API, used by upload/download, can write them; it cannot write a
    tmpfs); they are removed with the container (`remove_container(v=True)`)."""
    opts: DockerCreateOptions = {
        # "none": a namespace with only `lo`; no bridge, no address, no route.
        "network_mode": "none" if policy.isolate_network else "host",
        "cap_drop": list(policy.cap_drop),
        "mounts": [],
    }
    if policy.pids_limit is not None:
        opts["pids_limit"] = policy.pids_limit
    security = ["no-new-privileges:true"] if policy.no_new_privileges else []
    if policy.seccomp_profile:
        # The engine takes the profile's JSON text itself (the CLI reads it from a file).
        security.append(f"seccomp={seccomp.profile_json()}")
    if security:
        opts["security_opt"] = security
    if policy.runtime:
        opts["runtime"] = policy.runtime
    if storage_mb is not None:
        opts["storage_opt"] = {"size": f"{storage_mb}M"}
    if policy.read_only_root:
        opts["read_only"] = True
        dirs = dict.fromkeys([*policy.writable_dirs, *([workdir] if workdir else [])])
        opts["mounts"] = [docker.types.Mount(d, None, type="volume") for d in dirs]
    return opts
