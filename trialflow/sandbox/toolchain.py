"""The harness's own toolchain inside every sandbox, and the launcher that picks its keep-alive.

Why: the agent is root in its sandbox and can replace any binary the image holds (`timeout`,
`bash`, `rm`, `sleep`, the ENTRYPOINT). Whatever the harness itself runs there must come from
the host, read-only, and be invoked by absolute path (issue 20).

The toolchain is one static binary, Debian's `busybox-static` (`HOST_BUSYBOX`), bind-mounted
read-only at `BUSYBOX` into every sandbox when it is created. Static, so `/etc/ld.so.preload`
and the image's libraries do not reach it. The mount point is a file directly under `/`: the
kernel refuses to unlink or rename a mount point while it is mounted, and no directory above
it can be renamed, so an agent cannot make the path name something else for the next start.
The name starts with "busybox" because busybox picks its applet from argv[0] unless its
basename starts so (`/busybox-trialflow rm -rf X` runs the rm applet). Debian's build prefers
its own applets for bare command names, so the harness writes every path absolutely.

The launcher is the container's ENTRYPOINT (after the engine's own init, a host binary):
- first start (the agent phase): it runs the image's ENTRYPOINT with the keep-alive command
  as its arguments, exactly as Harbor runs it, the command looked up on the image's PATH (the
  image is still as built then: the agent has not run yet);
- every start after the worker wrote `VERIFY_MARKER` into `STATE_DIR` (an anonymous volume
  removed with the container; its mount point cannot be moved; the marker is written through
  the engine while the container is stopped, so no process of the agent's exists to undo
  it, and a marker the agent planted itself only asks for this same mode): it execs
  the toolchain's `sleep` and nothing else. The image's ENTRYPOINT and PATH are the agent's
  by then, so the verification restart runs neither (a task's services started by its
  ENTRYPOINT are not running during verification: they were not before this change either,
  `stop_processes` killed them).
"""

from __future__ import annotations

import struct
from pathlib import Path

from trialflow.errors import ToolchainUnavailable

HOST_BUSYBOX = Path("/bin/busybox")
BUSYBOX = "/busybox-trialflow"
STATE_DIR = "/.trialflow-state"
VERIFY_MARKER = "verify"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The launcher's script (busybox ash). The first argument is the command to run; a bare name
# is looked up on PATH here, not by `exec` (Debian's busybox would run its own applet), and
# run under its own name as argv[0], as the engine would run it.
LAUNCHER_SCRIPT = f"""\
if [ -e {STATE_DIR}/{VERIFY_MARKER} ]; then exec {BUSYBOX} sleep infinity; fi
p=$1; shift
case $p in
*/*) exec "$p" "$@";;
esac
IFS=:
for d in ${{PATH:-{DEFAULT_PATH}}}; do
  if [ -f "$d/$p" ] && [ -x "$d/$p" ]; then exec -a "$p" "$d/$p" "$@"; fi
done
echo "trialflow launcher: $p: not found on PATH" >&2
exit 127
"""


def tool(*argv: str) -> list[str]:
    """argv that runs a toolchain applet, e.g. `tool("rm", "-rf", "/tests")`."""
    return [BUSYBOX, *argv]


def launcher(image_entrypoint: list[str] | None, command: list[str]) -> tuple[list[str], list[str]]:
    """(entrypoint, cmd) for the container: the launcher, then the image's ENTRYPOINT and
    `command` as the launcher's arguments (module docstring)."""
    return [BUSYBOX, "sh", "-c", LAUNCHER_SCRIPT], ["trialflow-launcher", *(image_entrypoint or []), *command]


def is_static_elf(head: bytes) -> bool:
    """Whether an ELF file (its first bytes, program headers included) asks for no program
    interpreter (PT_INTERP), i.e. is statically linked. Only 64-bit little-endian ELF."""
    if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return False
    (phoff,) = struct.unpack_from("<Q", head, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
    for i in range(phnum):
        at = phoff + i * phentsize
        if at + 4 > len(head):
            return False
        (p_type,) = struct.unpack_from("<I", head, at)
        if p_type == 3:  # PT_INTERP
            return False
    return True


def check_host_busybox(path: Path = HOST_BUSYBOX) -> Path:
    """`path` when it is a static executable; ToolchainUnavailable naming the fix otherwise."""
    try:
        head = path.read_bytes()[:4096] if path.is_file() else b""
    except OSError as e:
        raise ToolchainUnavailable(f"cannot read the harness toolchain {path}: {e}") from None
    if not head:
        raise ToolchainUnavailable(
            f"the harness toolchain {path} is missing: install Debian's busybox-static (infra/setup.sh)"
        )
    if not is_static_elf(head):
        raise ToolchainUnavailable(
            f"{path} is not a static x86-64/arm64 ELF binary: install Debian's busybox-static, not busybox"
        )
    return path
