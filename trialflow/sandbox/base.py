"""Sandbox and SandboxBackend ABCs: the only surface the pipeline uses to run things.

Lifecycle of a `Sandbox`::

    backend.create(task, trial_id=..., labels=..., mounts=...)   image ready, container created (not running)
      -> sandbox.start()                                          container running; idempotent
      -> sandbox.exec / upload / download   (any number, any order; concurrent calls allowed)
      -> sandbox.stop()                                           container removed; idempotent, also
                                                                  after SandboxLost or on a never-started sandbox

After a Temporal activity retry on the same host, `backend.attach(sandbox.id)` returns a
handle to the same running sandbox (raises `SandboxLost` if it is gone). Leaked sandboxes
(worker crash) are removed by `backend.reap(older_than_s)`.

Contracts every implementation keeps:
- `exec` returns exit codes as data (`ExecResult`), never raises for a failing command. A
  timeout kills the command's process group and returns `timed_out=True` (exit code is then
  whatever the kill produced, typically 137). Infrastructure failures raise `SandboxLost`.
- `upload(local, remote_dir)`: a file lands at `remote_dir/<basename>`; a directory's
  *contents* land in `remote_dir` (created if missing). `download(remote, local_dir)` is the
  mirror: a file lands at `local_dir/<basename>`, a directory's contents in `local_dir`.
  Both preserve file modes. A missing remote path raises `SandboxPathNotFound`. `download`
  skips what would land outside `local_dir` (absolute links, links out of the tree) and
  clears setuid/setgid bits (tarfile's `data` filter, member by member). `download` is
  bounded: bytes (apparent sizes) and entries against an allowance, streamed, never read
  whole into memory; over it, `OutputBudgetExceeded` (never retried).
- Every method is async; implementations over blocking clients run them in threads.

Guarantees every backend gives (docs/design.md, "Sandbox network and reward integrity"):
- Network: a sandbox has no network of its own (no route, no address but loopback). Its only
  endpoints are listeners the worker serves into it (`listen_loopback`): the proxy session's
  protocol routes and, in the allowlist/public modes, the egress proxy. It reaches no worker
  service (proxy management, Temporal, S3, vLLM, other sandboxes).
- Processes: a pids limit, no privilege escalation (no-new-privileges, no raw sockets),
  and `stop_processes` stops everything the agent started, enforced from outside.
- Files: `download` reads through the backend, not through binaries inside the sandbox.
- Harness toolchain: every sandbox holds the host's static busybox, read-only, at
  `trialflow.sandbox.toolchain.BUSYBOX`; what the harness itself runs in a sandbox goes
  through it by absolute path (`toolchain.tool`), never through the image's PATH. Exec
  timeouts are enforced from outside the sandbox.
- Verification: `restart_for_verification` ends every process, the keep-alive included,
  and starts the sandbox again from its files with a keep-alive the agent never touched.

A Kubernetes backend fits the same ABCs (isolation: a NetworkPolicy denying all egress and
ingress, and a sidecar in the pod serving the session's routes on 127.0.0.1 over a Unix
socket to the proxy; `stop_processes`: a shared process namespace and a kill from the sidecar): create -> Pod spec (image from the same env-hash
tag in a registry, resources from the task, hostPath or CSI volumes for `mounts`, labels as
pod labels), exec -> the pods/exec subresource, upload/download -> tar over exec, reap ->
label selector + creationTimestamp. Nothing here assumes Docker.
"""

from __future__ import annotations

import abc
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trialflow.sandbox.transfer import Allowance
    from trialflow.settings import TrialflowSettings
    from trialflow.tasks import Task


@dataclass(frozen=True)
class ExecResult:
    """Outcome of one command. Output is decoded UTF-8 (invalid bytes replaced) and may be
    truncated to the backend's output cap (the tail is kept, prefixed by a marker line)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True)
class Mount:
    """A host path made visible inside the sandbox (read-only unless said otherwise).
    Used to mount host-installed scaffold CLIs (node, claude, opencode) into sandboxes."""

    source: str
    target: str
    read_only: bool = True


class Sandbox(abc.ABC):
    """One isolated environment for one trial attempt. See the module docstring."""

    @property
    @abc.abstractmethod
    def id(self) -> str:
        """Stable identifier, valid for `SandboxBackend.attach` on the same host."""

    @property
    def local_names(self) -> tuple[str, ...]:
        """Host names besides localhost that resolve to the sandbox's own loopback (a compose
        task's services: `trialflow.sandbox.pod`). Clients in the sandbox reach them directly,
        never through an egress proxy (its `NO_PROXY`)."""
        return ()

    @abc.abstractmethod
    async def start(self) -> None:
        """Start the sandbox. Idempotent. Raises SandboxStartFailed."""

    @abc.abstractmethod
    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | int | None = None,
        workdir: str | None = None,
    ) -> ExecResult:
        """Run `cmd` (a string goes through `bash -c`; a sequence is exec'd as argv).

        `timeout_s=None` means no limit. `user=None` uses the image's default user.
        `workdir=None` uses the task's `[environment].workdir`, else the image's WORKDIR.
        `env` is added to the image's environment (and the task's `[environment].env`).
        """

    @abc.abstractmethod
    async def upload(self, local_path: str | Path, remote_dir: str) -> None:
        """Copy a local file or a directory's contents into `remote_dir`."""

    @abc.abstractmethod
    async def download(
        self, remote_path: str, local_dir: str | Path, *, allowance: Allowance | None = None
    ) -> Path:
        """Copy a remote file or directory's contents into `local_dir`; returns the local
        path of the file, or `local_dir` for a directory. Streamed, and charged to
        `allowance` (None: the backend's log limits) member by member before any data is
        read; `OutputBudgetExceeded` when a member does not fit (`trialflow.sandbox.transfer`).
        What was copied before it stays in `local_dir` (the caller's temporary directory)."""

    @abc.abstractmethod
    async def listen_loopback(self) -> socket.socket:
        """A listening TCP socket on 127.0.0.1 *inside* the sandbox's network namespace,
        owned and served by the caller (outside the sandbox). Processes in the sandbox can
        connect to it; nothing else can. The port is the socket's `getsockname()[1]`. This
        is the sandbox's only way out (module docstring, "Network"). Raises SandboxLost."""

    @abc.abstractmethod
    async def stop_processes(self) -> int:
        """Kill every process in the sandbox except its keep-alive, from outside the sandbox
        (no binary inside it is trusted), and return how many were killed. After it returns,
        nothing the agent started runs any more, and the file system holds what it left.
        Raises SandboxLost (also when the processes cannot be stopped)."""

    @abc.abstractmethod
    async def restart_for_verification(self) -> None:
        """End every process of the sandbox, its keep-alive included (nothing the agent
        started, attached to or rewrote survives), and start it again from its file system
        with a keep-alive from the harness's toolchain, running neither the image's
        ENTRYPOINT nor anything on its PATH (the agent's to rewrite). Works on a sandbox the
        agent stopped (killed its keep-alive). Listeners served into the sandbox before
        (`listen_loopback`) no longer reach it. Raises SandboxLost (gone, engine
        unreachable) or SandboxRestartFailed (the engine could not start it from what the
        agent left: the agent's outcome)."""

    @abc.abstractmethod
    async def is_running(self) -> bool:
        """True while the sandbox runs; False when it stopped but still exists (its files
        kept: e.g. the agent killed its keep-alive). Raises SandboxLost when it no longer
        exists or the engine is unreachable."""

    @abc.abstractmethod
    async def base_environment(self) -> dict[str, str]:
        """The environment the sandbox was created with (the image's and the task's), as the
        engine holds it: nothing inside the sandbox can change it. Raises SandboxLost."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop and remove the sandbox, and any separate verifier sandbox created for it
        (`SandboxBackend.create(verifier_for=...)`) that is still there. Idempotent; never
        raises for an absent sandbox."""


@dataclass(frozen=True)
class ImageInfo:
    """Result of preparing a task image: `built` is False on a cache hit."""

    tag: str
    image_id: str
    built: bool
    duration_s: float
    log_tail: str = ""


@dataclass(frozen=True)
class ReapReport:
    removed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


class SandboxBackend(abc.ABC):
    """Creates sandboxes for tasks. One instance per worker process, shared by activities.

    The worker builds the one its settings name (`trialflow.sandbox.registry`)."""

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, settings: TrialflowSettings, *, labels: Mapping[str, str]) -> SandboxBackend:
        """The backend a worker process runs, configured from its settings (policy, transfer
        limits, images), with `labels` on every sandbox it creates; `reap` removes only
        sandboxes with those labels (workers sharing an engine or cluster)."""

    def ping(self) -> None:
        """One blocking round trip to the backend's engine (admission's engine-latency
        signal, run in a thread); raises when the engine is unreachable. The default has no
        engine to reach and returns at once."""
        return None

    def close(self) -> None:
        """Release the backend's clients and threads (the worker's exit). Default: nothing."""
        return None

    @abc.abstractmethod
    async def create(
        self,
        task: Task,
        *,
        trial_id: str,
        labels: Mapping[str, str] | None = None,
        mounts: Sequence[Mount] = (),
        verifier_for: Sandbox | None = None,
    ) -> Sandbox:
        """Prepare the image (build or cache hit) and create a not-yet-started sandbox.

        The agent's sandbox by default (its images are prepared: the task's and, for a
        separate verifier environment, the verifier's). With `verifier_for`, the task's
        separate verifier environment (`Task.separate_verifier`) for that agent sandbox:
        its own image, resources, env and workdir, no mounts, the same isolation; it
        shares nothing with the agent's sandbox, and `verifier_for.stop()` removes it too.

        Raises ImageBuildFailed / ImageBuildTimeout / ImageUnavailable / ImagePullFailed /
        DockerfileUnsupported / SandboxStartFailed.
        """

    def image_progress(self, task: Task) -> str | None:
        """What preparing the task's images is doing now, one line (heartbeat details while
        `create` runs), or None: nothing to say, or a backend that does not tell."""
        return None

    @abc.abstractmethod
    async def attach(self, sandbox_id: str) -> Sandbox:
        """Handle to an existing sandbox by id. Raises SandboxLost if it no longer exists."""

    @abc.abstractmethod
    async def reap(self, older_than_s: float) -> ReapReport:
        """Remove managed sandboxes created more than `older_than_s` seconds ago.
        `older_than_s=0` removes every managed sandbox of this backend."""

    async def engine_id(self) -> str | None:
        """Identity of the engine that holds this backend's sandboxes, so that a worker can
        tell whether a sandbox id it is handed is on its own engine (None: unknown)."""
        return None
