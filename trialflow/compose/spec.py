"""A task's compose environment as trialflow runs it: typed, validated, interpolated (pure).

`ComposeProject` is what `trialflow.compose.load.load_compose` makes of
`environment/docker-compose.yaml` merged over Harbor's `main` service: the extra services
(`ComposeService`, each a container in the sandbox's network namespace), what the task's
file adds to `main` (its `depends_on` and `environment`), the start order and the names
that resolve to the shared loopback. Times are seconds, sizes bytes.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict

__all__ = [
    "BindMount",
    "ComposeProject",
    "ComposeService",
    "Condition",
    "Dependency",
    "ServiceBuild",
    "ServiceHealthcheck",
]

MAIN = "main"  # Harbor's agent service (harbor.constants.MAIN_SERVICE_NAME)


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Condition(StrEnum):
    """`depends_on` conditions (Compose spec); the short syntax means `service_started`."""

    STARTED = "service_started"
    HEALTHY = "service_healthy"
    COMPLETED = "service_completed_successfully"


class Dependency(_Frozen):
    condition: Condition = Condition.STARTED
    required: bool = True  # false: a dependency that is not defined (or not started) is skipped


class ServiceHealthcheck(_Frozen):
    """The engine's healthcheck. `test` in the engine's form: ["CMD", argv...],
    ["CMD-SHELL", command] or ["NONE"] (disabled, also the image's); None: the image's
    own test with these timings. Unset timings are the image's, else the engine's
    defaults (interval 30 s, timeout 30 s, retries 3, start period 0)."""

    test: tuple[str, ...] | None = None
    interval_s: float | None = None
    timeout_s: float | None = None
    start_period_s: float | None = None
    retries: int | None = None

    @property
    def disabled(self) -> bool:
        return self.test == ("NONE",)


class ServiceBuild(_Frozen):
    """`build:`: a context directory inside environment/, its Dockerfile, args and target."""

    context: Path
    dockerfile: Path
    args: dict[str, str] = {}
    target: str | None = None


class BindMount(_Frozen):
    """A read-only bind of a path inside environment/ (the only host mount honoured)."""

    source: Path
    target: str


class ComposeService(_Frozen):
    """One service other than main. `image` is the local image to run (None: the one
    `build` makes); `entrypoint`/`command` None keep the image's, `entrypoint == ()`
    clears it (Compose's `entrypoint: []`)."""

    name: str
    image: str | None = None
    build: ServiceBuild | None = None
    entrypoint: tuple[str, ...] | None = None
    command: tuple[str, ...] | None = None
    environment: dict[str, str] = {}
    working_dir: str | None = None
    user: str | None = None
    healthcheck: ServiceHealthcheck | None = None
    depends_on: dict[str, Dependency] = {}
    init: bool = False
    tty: bool = False
    stdin_open: bool = False
    read_only: bool = False
    stop_signal: str | None = None
    restart: str | None = None  # the engine's restart policy name ("on-failure:3" keeps its count)
    shm_size: int | None = None
    mem_limit: int | None = None
    cpus: float | None = None
    pids_limit: int | None = None
    cap_drop: tuple[str, ...] = ()
    labels: dict[str, str] = {}
    binds: tuple[BindMount, ...] = ()
    tmpfs: tuple[str, ...] = ()  # container paths
    anonymous_volumes: tuple[str, ...] = ()  # container paths
    expose: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # container_name, hostname: more names for the loopback


class ComposeProject(_Frozen):
    """The task's compose environment (module docstring). `order` lists every service
    and `main` so that each comes after what it depends on."""

    path: Path
    services: tuple[ComposeService, ...] = ()
    main_depends_on: dict[str, Dependency] = {}
    main_environment: dict[str, str] = {}
    order: tuple[str, ...] = (MAIN,)

    def service(self, name: str) -> ComposeService:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(name)

    def depends_on(self, name: str) -> dict[str, Dependency]:
        """What `name` (a service or main) waits for before it starts."""
        return self.main_depends_on if name == MAIN else self.service(name).depends_on

    @property
    def host_names(self) -> tuple[str, ...]:
        """Every name that resolves to the shared loopback: main, the services, aliases."""
        names = [MAIN, *(s.name for s in self.services), *(a for s in self.services for a in s.aliases)]
        return tuple(dict.fromkeys(names))
