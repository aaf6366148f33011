"""The harness toolchain's pure parts: the static-binary check, the launcher's argv, and the
launcher script itself under the host's busybox (no Docker)."""

import subprocess
from pathlib import Path

import pytest

from trialflow.errors import ToolchainUnavailable
from trialflow.sandbox import toolchain


def test_host_busybox_is_static_and_python_is_not():
    assert toolchain.check_host_busybox() == toolchain.HOST_BUSYBOX
    assert not toolchain.is_static_elf(Path("/bin/ls").read_bytes()[:4096])
    assert not toolchain.is_static_elf(b"#!/bin/sh\n")


def test_a_missing_or_dynamic_toolchain_is_a_clear_error(tmp_path):
    with pytest.raises(ToolchainUnavailable, match="busybox-static"):
        toolchain.check_host_busybox(tmp_path / "busybox")
    with pytest.raises(ToolchainUnavailable, match="not a static"):
        toolchain.check_host_busybox(Path("/bin/ls"))


def test_launcher_runs_the_image_entrypoint_with_the_keep_alive_as_arguments():
    entry, cmd = toolchain.launcher(["/docker-entrypoint.sh", "--x"], ["sh", "-c", "exec sleep infinity"])
    assert entry == [toolchain.BUSYBOX, "sh", "-c", toolchain.LAUNCHER_SCRIPT]
    assert cmd == ["trialflow-launcher", "/docker-entrypoint.sh", "--x", "sh", "-c", "exec sleep infinity"]
    assert toolchain.launcher(None, ["true"])[1] == ["trialflow-launcher", "true"]


def _launch(*argv: str, path: str = "/usr/bin:/bin") -> subprocess.CompletedProcess[str]:
    # The script as the container runs it, under the host's busybox; no marker here.
    return subprocess.run(
        ["/bin/busybox", "sh", "-c", toolchain.LAUNCHER_SCRIPT, "trialflow-launcher", *argv],
        capture_output=True,
        text=True,
        env={"PATH": path},
        check=False,
    )


def test_launcher_looks_bare_names_up_on_path_not_among_busybox_applets():
    # `readlink` is a busybox applet too: the image's (here the host's) must run.
    res = _launch("sh", "-c", 'readlink /proc/$$/exe; echo "$0"')
    assert res.stdout.split() == [str(Path("/bin/sh").resolve()), "sh"], res
    assert _launch("/bin/echo", "a b").stdout == "a b\n"
    missing = _launch("no-such-command")
    assert missing.returncode == 127 and "not found on PATH" in missing.stderr
