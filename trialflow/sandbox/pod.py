"""A compose task's services and its sandbox as one pod (Docker backend).

Harbor 0.25 runs a compose task as `docker compose up --detach --wait` on bridge networks.
Here there is no bridge: every container of the pod shares ONE network namespace, the
sandbox's, which has only a loopback interface (the no-network design, docs/design.md).

- **Holder**: a small container made first (`<sandbox>-pod`: the toolchain's `sleep`,
  read-only root, every capability dropped, 16 pids, 32 MiB) owns the namespace. Main
  and the services join it (`network_mode: container:<holder>`), so main's verification
  restart (`DockerSandbox.restart_for_verification`) rejoins the same namespace and
  test.sh still reaches the services, as in Harbor; were main the owner, its restart
  would leave the services in a namespace main no longer shares.
- **Names**: the holder's /etc/hosts maps `main`, every service and its `container_name`
  / `hostname` to 127.0.0.1; the engine gives every container that joins a namespace the
  owner's hosts file, so each name resolves in main and in the services alike.
- **Order**: `ComposeProject.order`; before a container starts, what it `depends_on` is
  awaited (`service_started`: running; `service_healthy`: the engine's healthcheck says
  healthy; `service_completed_successfully`: exited 0). Main is one of the nodes: its
  start is `DockerSandbox.start`'s (the image's ENTRYPOINT as Harbor runs it). Then, as
  `up --wait`, every service with a healthcheck must be healthy and every other one
  running (or exited 0 where something waits for its completion). All of it within
  `start_timeout_s` (`ServiceStartTimeout`, retried); an exited service, a failed start
  or a `service_healthy` dependency without a healthcheck: `ServiceFailed`; an unhealthy
  one: `ServiceUnhealthy` with its last probe's output (both never retried).
- **Hardening**: each service gets the sandbox's `SandboxPolicy` (pids limit, no new
  privileges, the seccomp profile, dropped capabilities plus the service's `cap_drop`,
  runtime, read-only root when the policy says so) and limits: the service's own
  `mem_limit`/`cpus`/`pids_limit` where set, never above the task's `[environment]`
  cpus/memory_mb (Harbor's limits are main's) nor the policy's pids limit; without its
  own, the task's. Only read-only binds inside environment/, tmpfs and anonymous volumes
  are mounted (trialflow.compose.load refuses the rest).
- **Teardown**: every container carries the backend's labels (managed, trial id,
  created-at: the reaper removes a dead worker's pods like its sandboxes) plus
  `trialflow.pod_of=<sandbox>` and `trialflow.pod_role` (service / holder);
  `DockerSandbox.stop` removes the services, then main, then the holder.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import docker.errors
import docker.types
import requests.exceptions

from trialflow.compose import MAIN, ComposeProject, ComposeService, Condition
from trialflow.errors import SandboxLost, ServiceFailed, ServiceStartTimeout, ServiceUnhealthy
from trialflow.sandbox import toolchain
from trialflow.sandbox.reaper import LABEL_POD_OF, LABEL_POD_ROLE, LABEL_SERVICE

if TYPE_CHECKING:
    from trialflow.sandbox.docker import DockerBackend, DockerCreateOptions

__all__ = ["DockerPod", "gate", "holder_options", "service_options"]

POLL_S = 0.25
HOLDER_PIDS = 16
HOLDER_MEMORY = "32m"


def holder_options(
    *,
    name: str,
    image: str,
    labels: Mapping[str, str],
    host_names: tuple[str, ...],
    hardening: DockerCreateOptions,
) -> dict[str, Any]:
    """`containers.create` arguments of the namespace holder (pure)."""
    return {
        "image": image,
        "name": name,
        "entrypoint": toolchain.tool("sleep", "infinity"),
        "command": [],
        "detach": True,
        "labels": {**labels, LABEL_POD_ROLE: "holder"},
        "network_mode": hardening["network_mode"],
        "extra_hosts": {n: "127.0.0.1" for n in host_names},
        "healthcheck": {"test": ["NONE"]},  # main's image may have one; the holder runs nothing of it
        "cap_drop": ["ALL"],
        "read_only": True,
        "pids_limit": HOLDER_PIDS,
        "mem_limit": HOLDER_MEMORY,
        "memswap_limit": HOLDER_MEMORY,
        **{k: v for k, v in hardening.items() if k in ("security_opt", "runtime")},
        "mounts": [
            docker.types.Mount(toolchain.BUSYBOX, str(toolchain.HOST_BUSYBOX), type="bind", read_only=True)
        ],
    }


def service_options(
    service: ComposeService,
    *,
    name: str,
    image: str,
    holder_id: str,
    labels: Mapping[str, str],
    hardening: DockerCreateOptions,
    cpus: float | None,
    memory_mb: int | None,
) -> dict[str, Any]:
    """`containers.create` arguments of one service (pure): Compose's meaning of its keys,
    the sandbox's hardening, limits capped at the task's (module docstring). `cpus`:
    the task's, already clamped to the host's; `memory_mb`: the task's."""
    opts: dict[str, Any] = {
        "image": image,
        "name": name,
        "detach": True,
        # the task's labels cannot override ours (managed, trial id, pod)
        "labels": {**service.labels, **labels, LABEL_POD_ROLE: "service", LABEL_SERVICE: service.name},
        "environment": dict(service.environment),
        "init": service.init,
        "tty": service.tty,
        "stdin_open": service.stdin_open,
        **{k: v for k, v in hardening.items() if k not in ("mounts", "network_mode")},
        "network_mode": f"container:{holder_id}",
    }
    if service.entrypoint is not None:
        opts["entrypoint"] = list(service.entrypoint) or [""]  # [""]: the image's is cleared
    if service.command is not None:
        opts["command"] = list(service.command)
    for key in ("working_dir", "user", "stop_signal", "shm_size"):
        if getattr(service, key) is not None:
            opts[key] = getattr(service, key)
    if service.read_only:
        opts["read_only"] = True
    opts["cap_drop"] = sorted({*hardening["cap_drop"], *service.cap_drop})
    pids = [p for p in (service.pids_limit, hardening.get("pids_limit")) if p is not None]
    if pids:
        opts["pids_limit"] = min(pids)
    memory = [m for m in (service.mem_limit, memory_mb and memory_mb << 20) if m]
    if memory:
        opts["mem_limit"] = opts["memswap_limit"] = min(memory)
    cpu = [c for c in (service.cpus, cpus) if c]
    if cpu:
        opts["nano_cpus"] = int(min(cpu) * 1e9)
    if service.restart:
        policy, _, count = service.restart.partition(":")
        opts["restart_policy"] = {"Name": policy, "MaximumRetryCount": int(count or 0)}
    if service.healthcheck is not None:
        hc = service.healthcheck
        check: dict[str, Any] = {"test": list(hc.test)} if hc.test else {}
        for key, seconds in (
            ("interval", hc.interval_s),
            ("timeout", hc.timeout_s),
            ("start_period", hc.start_period_s),
        ):
            if seconds:
                check[key] = int(seconds * 1e9)
        if hc.retries is not None:
            check["retries"] = hc.retries
        opts["healthcheck"] = check
    mounts = list(hardening["mounts"])
    mounts += [
        docker.types.Mount(b.target, str(b.source), type="bind", read_only=True) for b in service.binds
    ]
    mounts += [docker.types.Mount(t, None, type="tmpfs") for t in service.tmpfs]
    mounts += [docker.types.Mount(t, None, type="volume") for t in service.anonymous_volumes]
    opts["mounts"] = mounts
    return opts


def gate(service: str, condition: Condition, state: Mapping[str, Any]) -> bool:
    """Whether `condition` holds for a container in engine `state` (inspect's "State"):
    True met, False not yet; raises ServiceFailed / ServiceUnhealthy when it never will."""
    status = state.get("Status")
    exited = status in ("exited", "dead")
    code = state.get("ExitCode")
    if condition == Condition.COMPLETED:
        if not exited:
            return False
        if code != 0:
            raise ServiceFailed(
                f"service {service} exited with code {code} (a dependency waits for it to succeed)"
            )
        return True
    if exited:
        raise ServiceFailed(f"service {service} exited with code {code} while it was needed running")
    if status != "running":
        return False  # created, restarting
    if condition == Condition.STARTED:
        return True
    health = state.get("Health")
    if not health:
        raise ServiceFailed(
            f"service {service} has no healthcheck, but a dependency waits for it to be healthy"
        )
    if health.get("Status") == "unhealthy":
        probes = health.get("Log") or []
        last = probes[-1] if probes else {}
        output = str(last.get("Output", "")).strip()[-500:]
        raise ServiceUnhealthy(
            f"service {service} is unhealthy: its healthcheck failed {health.get('FailingStreak', '?')} times"
            f" in a row (last exit code {last.get('ExitCode', '?')}"
            + (f", output: {output}" if output else "")
            + ")"
        )
    return health.get("Status") == "healthy"


class DockerPod:
    """The holder and service containers around one sandbox (module docstring). Made by
    `DockerBackend.create`, started by the sandbox's `start`."""

    def __init__(
        self,
        backend: DockerBackend,
        project: ComposeProject,
        holder_id: str,
        services: dict[str, str],
        start_timeout_s: float,
    ) -> None:
        self._backend = backend
        self.project = project
        self.holder_id = holder_id
        self._services = services  # service name -> container id
        self._timeout = start_timeout_s

    @property
    def network_mode(self) -> str:
        """What main joins: the holder's namespace."""
        return f"container:{self.holder_id}"

    @classmethod
    async def create(
        cls,
        backend: DockerBackend,
        project: ComposeProject,
        *,
        sandbox_name: str,
        main_image: str,
        images: Mapping[str, str],
        labels: Mapping[str, str],
        hardening: Callable[[str | None], DockerCreateOptions],
        cpus: float | None,
        memory_mb: int | None,
        start_timeout_s: float,
    ) -> DockerPod:
        """Create (not start) the holder and the services; on any failure nothing stays.
        `hardening(workdir)`: the backend's `docker_create_options` for a container."""
        client = backend.client
        pod_labels = {**labels, LABEL_POD_OF: sandbox_name}
        made: list[str] = []
        try:
            holder = await backend._run(
                lambda: client.containers.create(
                    **holder_options(
                        name=f"{sandbox_name}-pod",
                        image=main_image,
                        labels=pod_labels,
                        host_names=project.host_names,
                        hardening=hardening(None),
                    )
                )
            )
            made.append(holder.id)
            services: dict[str, str] = {}
            for svc in project.services:
                opts = service_options(
                    svc,
                    name=f"{sandbox_name}-{svc.name}",
                    image=images[svc.name],
                    holder_id=holder.id,
                    labels=pod_labels,
                    hardening=hardening(svc.working_dir),
                    cpus=cpus,
                    memory_mb=memory_mb,
                )
                container = await backend._run(lambda o=opts: client.containers.create(**o))  # type: ignore[misc]
                made.append(container.id)
                services[svc.name] = container.id
        except BaseException:
            for cid in made:
                await backend._run(lambda c=cid: _force_remove(client.api, c))  # type: ignore[misc]
            raise
        return cls(backend, project, holder.id, services, start_timeout_s)

    async def remove(self) -> None:
        """Remove every container of the pod (create's undo when main could not be made)."""
        api = self._backend.client.api
        for cid in [*self._services.values(), self.holder_id]:
            await self._backend._run(lambda c=cid: _force_remove(api, c))  # type: ignore[misc]

    async def start(self, start_main: Callable[[], Awaitable[None]]) -> None:
        """Holder, then each of `project.order` once its dependencies hold, then `up --wait`'s
        readiness of every service (module docstring)."""
        deadline = time.monotonic() + self._timeout
        await self._start_container(self.holder_id, "the pod's namespace holder")
        for node in self.project.order:
            for dep, d in self.project.depends_on(node).items():
                await self._wait(dep, d.condition, deadline, waiter=node)
            if node == MAIN:
                await start_main()
            else:
                await self._start_container(self._services[node], f"service {node}")
        completions = {
            dep
            for n in self.project.order
            for dep, d in self.project.depends_on(n).items()
            if d.condition == Condition.COMPLETED
        }
        for svc in self.project.services:
            if svc.name in completions:
                continue
            has_check = svc.healthcheck is not None and not svc.healthcheck.disabled
            if not has_check:  # the image's own HEALTHCHECK counts as one
                state = await self._state(svc.name)
                has_check = bool(state.get("Health"))
            await self._wait(svc.name, Condition.HEALTHY if has_check else Condition.STARTED, deadline)

    async def _start_container(self, cid: str, what: str) -> None:
        api = self._backend.client.api
        try:
            await self._backend._run(lambda: api.start(cid))
        except docker.errors.NotFound as e:
            raise SandboxLost(f"{what} no longer exists: {e}") from e
        except docker.errors.APIError as e:  # e.g. its command does not exist in the image
            raise ServiceFailed(f"{what} could not start: {e.explanation or e}") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxLost(f"docker engine unreachable while starting {what}: {e}") from e

    async def _state(self, service: str) -> dict[str, Any]:
        cid = self._services[service]
        try:
            return await self._backend._run(lambda: self._backend.client.api.inspect_container(cid)["State"])
        except docker.errors.NotFound as e:
            raise SandboxLost(f"service {service} no longer exists: {e}") from e
        except requests.exceptions.ConnectionError as e:
            raise SandboxLost(f"docker engine unreachable while watching service {service}: {e}") from e

    async def _wait(self, service: str, condition: Condition, deadline: float, *, waiter: str = "") -> None:
        if service == MAIN:
            return  # main's only condition is started (compose.load), and it starts before its dependents
        while True:
            if gate(service, condition, await self._state(service)):
                return
            if time.monotonic() > deadline:
                who = f"{waiter} waits for " if waiter else ""
                raise ServiceStartTimeout(
                    f"{who}service {service} ({condition.value}): not ready within {self._timeout:.0f}s"
                )
            await asyncio.sleep(POLL_S)


def _force_remove(api: docker.APIClient, cid: str) -> None:
    try:
        api.remove_container(cid, force=True, v=True)
    except docker.errors.NotFound:
        pass
