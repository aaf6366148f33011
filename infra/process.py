"""Managed subprocesses with readiness checks, log files and a firm stop.

Error tree::

    ServiceError                 any failure to bring a service up
    ├── BinaryNotFoundError      the executable the service needs is missing
    ├── ServiceStartError        the process died, or never became ready in time;
    │                            the message carries the tail of its log
    └── DockerUnavailableError   no engine answers and none can be started here

Processes start in their own session (process group) so that `stop()` reaches the
children they spawn too (vLLM's engine core, for one) and so that a process the
caller chooses not to stop outlives the caller.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class ServiceError(RuntimeError):
    """Base of every infrastructure start-up failure."""


class BinaryNotFoundError(ServiceError):
    """An executable a service needs is not installed where it is looked for."""


class ServiceStartError(ServiceError):
    """A service process exited early or did not become ready within its timeout."""


class DockerUnavailableError(ServiceError):
    """No Docker engine answers, and this process cannot start one."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that is free on `host` right now.

    Edge case: another process can take the port between this call and its use;
    callers that start servers on it surface that as a `ServiceStartError`.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def log_tail(path: Path, max_lines: int = 40) -> str:
    """Last `max_lines` lines of a log file; empty if the file does not exist."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-max_lines:])


@dataclass
class ManagedProcess:
    """One long-running server process whose output goes to `log_path`.

    Lifecycle: `start()` -> `wait_ready(check)` -> ... -> `stop()`. `stop()` is
    idempotent and safe on a process that already exited.
    """

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    _popen: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _stopped: bool = field(default=False, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen else None

    def alive(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    def start(self) -> ManagedProcess:
        if not Path(self.argv[0]).exists():
            raise BinaryNotFoundError(f"{self.name}: executable not found: {self.argv[0]}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {})}
        with self.log_path.open("ab") as log:
            self._popen = subprocess.Popen(
                list(self.argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def wait_ready(self, check: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> None:
        """Poll `check` until it returns True.

        Raises ServiceStartError (with the log tail) if the process exits first or
        `timeout_s` passes; on timeout the process is stopped so nothing leaks.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                code = self._popen.returncode if self._popen else None
                raise ServiceStartError(
                    f"{self.name} exited with code {code} before it was ready; "
                    f"log {self.log_path} ends with:\n{log_tail(self.log_path)}"
                )
            if check():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceStartError(
                    f"{self.name} not ready after {timeout_s:.0f}s; "
                    f"log {self.log_path} ends with:\n{log_tail(self.log_path)}"
                )
            time.sleep(poll_s)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL it after `grace_s` seconds.

        The grace period is bounded because some servers (SeaweedFS) ignore
        SIGTERM for longer than any caller wants to wait.
        """
        if self._popen is None or self._stopped:
            return
        self._stopped = True
        if self._popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self._popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        # The leader may be gone while children it spawned still run: kill the group anyway.
        self._signal_group(signal.SIGKILL)
        self._popen.wait()

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self._popen is not None
        try:
            os.killpg(self._popen.pid, sig)
        except ProcessLookupError:
            pass
