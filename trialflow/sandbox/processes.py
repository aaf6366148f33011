"""A container's processes seen from the host: list them by cgroup, kill all but the keep-alive.

Used before a separate verifier copies the artifacts out (`Sandbox.stop_processes`: nothing
the agent started keeps writing them), and for exec timeouts (`exec_tree`). Shared-mode
verification does not rely on it: the keep-alive it spares could have been taken over
(/proc/PID/mem needs no ptrace), so the sandbox is restarted instead
(`Sandbox.restart_for_verification`). It
runs on the host, by host pid, so no binary inside the sandbox (a replaced `kill`, `sh`
or `ps`) is trusted. Needs the worker to share the host's pid namespace and cgroup file
system with the engine, as root (a worker on the machine, or a privileged node agent).

The keep-alive is the container's init (`docker-init`, the engine's `State.Pid`) and its
first child (`sleep infinity`); every other process in the container's cgroup is the
agent's, the scaffold's or a service the task started, and is killed with SIGKILL. The
cgroup is frozen (`freezer`) while the victims are listed and signalled, so a fork bomb
cannot outrun the sweep; a few sweeps after thawing confirm the cgroup is empty.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_procs_file(pid: int) -> Path:
    """The `cgroup.procs` of `pid`'s cgroup: the unified (v2) hierarchy, else v1's `pids`
    controller (every container has one), else `memory`."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    by_controller: dict[str, str] = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            by_controller[name] = path
    for name, sub in (("pids", "pids"), ("memory", "memory")):
        if name in by_controller:
            return CGROUP_ROOT / sub / by_controller[name].lstrip("/") / "cgroup.procs"
    if "" in by_controller:
        return CGROUP_ROOT / by_controller[""].lstrip("/") / "cgroup.procs"
    raise OSError(f"no pids/memory/unified cgroup for pid {pid}: {lines}")


def freezer(pid: int) -> tuple[Path, bytes, bytes] | None:
    """(file, freeze value, thaw value) of `pid`'s cgroup freezer: v1's `freezer.state`
    (FROZEN / THAWED) or v2's `cgroup.freeze` (1 / 0); None without one. Written directly,
    not through `docker pause`: the engine updates its paused flag from an asynchronous event,
    which can land after a quick unpause and leave the container marked paused."""
    by_controller: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            by_controller[name] = path
    if "freezer" in by_controller:
        state = CGROUP_ROOT / "freezer" / by_controller["freezer"].lstrip("/") / "freezer.state"
        if state.exists():
            return state, b"FROZEN", b"THAWED"
    if "" in by_controller:
        freeze = CGROUP_ROOT / by_controller[""].lstrip("/") / "cgroup.freeze"
        if freeze.exists():
            return freeze, b"1", b"0"
    return None


def cgroup_pids(procs_file: Path) -> set[int]:
    """Live (non-zombie) pids listed in a `cgroup.procs` file."""
    pids = set()
    for text in procs_file.read_text().split():
        pid = int(text)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if state != "Z":
            pids.add(pid)
    return pids


def _start_time(pid: int) -> int:
    # Field 22 of /proc/PID/stat (clock ticks since boot); fields after the ")" of comm.
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def keep_alive_pids(init_pid: int) -> set[int]:
    """The container's init and its oldest child (the keep-alive command)."""
    children_file = Path(f"/proc/{init_pid}/task/{init_pid}/children")
    children = [int(p) for p in children_file.read_text().split()]
    keep = {init_pid}
    alive = []
    for child in children:
        try:
            alive.append((_start_time(child), child))
        except FileNotFoundError:
            continue
    if alive:
        keep.add(min(alive)[1])
    return keep


def kill_pids(pids: set[int]) -> int:
    """SIGKILL each pid; returns how many signals were delivered (gone ones are skipped)."""
    killed = 0
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            continue
    return killed


def _ppid_pgrp(pid: int) -> tuple[int, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), int(fields[2])


def exec_tree(pid: int, procs_file: Path) -> set[int]:
    """`pid` (an exec's process, by host pid), its descendants, and the members of its
    process group when it leads one: what an exec's timeout kills (coreutils `timeout`
    kills the group; a descendant that left it with setsid is caught by the parentage).
    A process reparented to the container's init is no longer either: it outlives the
    exec as it would coreutils' timeout (`stop_processes` and the verification restart
    end it)."""
    links = {p: link for p in cgroup_pids(procs_file) if (link := _ppid_pgrp(p)) is not None}
    if pid not in links:
        return set()
    tree, grew = {pid}, True
    while grew:
        grew = False
        for p, (ppid, _) in links.items():
            if ppid in tree and p not in tree:
                tree.add(p)
                grew = True
    if links[pid][1] == pid:
        tree |= {p for p, (_, pgrp) in links.items() if pgrp == pid}
    return tree
