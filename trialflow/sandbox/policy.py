"""What every sandbox is allowed to do: the backend-neutral hardening policy (pure).

A `SandboxPolicy` is read once from the settings and handed to the backend; each backend
maps it onto its engine (Docker: `docker_create_options`; a Kubernetes backend would map
the same fields onto the pod's securityContext, `pids` limit and runtimeClassName).

Defaults and why:
- `isolate_network=True`: the sandbox has a network namespace of its own with only a
  loopback interface and no route out; its one endpoint is what the worker serves into it
  (`Sandbox.listen_loopback`: its proxy session, and an egress proxy in the allowlist and
  public modes). False (host networking: it reaches every service on the host's loopback)
  exists only to measure what isolation costs (bench/isolation.py).
- `pids_limit=1024`: a fork bomb stops at the limit inside its own sandbox instead of
  taking down the host, the engine, the worker and the proxy. None: unlimited.
- `no_new_privileges=True`: setuid binaries and file capabilities cannot raise privileges.
- `cap_drop`: of the engine's default capabilities, those no coding task needs and an
  attacker wants: NET_RAW (raw sockets: sniffing, spoofing), MKNOD (device nodes),
  AUDIT_WRITE, SETFCAP, SETPCAP, SYS_CHROOT. CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL,
  SETUID/SETGID (apt drops to `_apt`; tasks run services as other users) and
  NET_BIND_SERVICE stay.
- `seccomp_profile=True`: the engine's default syscall allowance minus process tampering
  (ptrace, process_vm_*, pidfd_getfd) and what the engine already refuses unprivileged
  containers (`trialflow.sandbox.seccomp`): an agent cannot attach to the keep-alive or
  any other process of its sandbox. False: the engine's own default profile (it allows
  ptrace), for tasks that need a debugger (gdb, strace) in the sandbox.
- `read_only_root=False`: optional, because many tasks install packages into /usr while
  the agent works. When True the root file system is read-only and only `writable_dirs`
  (plus the task's workdir) are writable.
- `runtime=None`: the engine's default (runc). "runsc" selects gVisor where installed.
- `enforce_storage=True`: the task's `storage_mb` is applied where the engine can
  (Docker: overlay2 on xfs with project quotas); elsewhere it is logged as not enforced.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CAP_DROP = ("NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SETPCAP", "SYS_CHROOT")
# Writable with a read-only root: scratch space, the verifier's and agent's log dirs and
# the upload targets of the verifier (/tests) and the oracle (/solution).
DEFAULT_WRITABLE_DIRS = ("/tmp", "/var/tmp", "/run", "/root", "/logs", "/tests", "/solution")


@dataclass(frozen=True)
class SandboxPolicy:
    """Hardening applied to every sandbox of a backend (module docstring for defaults)."""

    isolate_network: bool = True
    pids_limit: int | None = 1024
    no_new_privileges: bool = True
    seccomp_profile: bool = True
    cap_drop: tuple[str, ...] = DEFAULT_CAP_DROP
    read_only_root: bool = False
    writable_dirs: tuple[str, ...] = DEFAULT_WRITABLE_DIRS
    runtime: str | None = None
    enforce_storage: bool = True

    def __post_init__(self) -> None:
        if self.pids_limit is not None and self.pids_limit < 16:
            raise ValueError(f"pids_limit {self.pids_limit} is too small to run an agent (min 16)")
        for d in self.writable_dirs:
            if not d.startswith("/"):
                raise ValueError(f"writable dir {d!r} must be an absolute path")
