"""ManagedProcess lifecycle on plain shell processes (no services needed)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from infra import (
    BinaryNotFoundError,
    ManagedProcess,
    ServiceStartError,
    free_port,
    log_tail,
    port_open,
)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_stop_escalates_to_sigkill_and_reaches_children(tmp_path: Path) -> None:
    # Both the leader and its child ignore SIGTERM, like SeaweedFS does.
    script = f"trap '' TERM; (trap '' TERM; sleep 60) & echo $! > {tmp_path}/child; sleep 60"
    proc = ManagedProcess("stubborn", ["/bin/sh", "-c", script], tmp_path / "log").start()
    proc.wait_ready(lambda: (tmp_path / "child").exists(), timeout_s=10, poll_s=0.05)
    child = int((tmp_path / "child").read_text())
    started = time.monotonic()
    proc.stop(grace_s=0.5)
    assert time.monotonic() - started < 5
    assert not proc.alive()
    assert _gone(proc.pid)
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)  # the orphaned child is reaped by init shortly after SIGKILL
    assert _gone(child)
    proc.stop()  # idempotent


def test_process_that_exits_early_reports_its_log_tail(tmp_path: Path) -> None:
    proc = ManagedProcess(
        "crasher", ["/bin/sh", "-c", "echo first; echo boom-marker >&2; exit 3"], tmp_path / "c.log"
    )
    proc.start()
    with pytest.raises(ServiceStartError, match=r"(?s)exited with code 3.*boom-marker"):
        proc.wait_ready(lambda: False, timeout_s=10)


def test_timeout_stops_the_process(tmp_path: Path) -> None:
    proc = ManagedProcess("slow", ["/bin/sh", "-c", "echo waiting; sleep 60"], tmp_path / "s.log").start()
    with pytest.raises(ServiceStartError, match=r"(?s)not ready after.*waiting"):
        proc.wait_ready(lambda: False, timeout_s=0.5, poll_s=0.1)
    assert not proc.alive()


def test_missing_binary_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(BinaryNotFoundError):
        ManagedProcess("ghost", [str(tmp_path / "no-such-binary")], tmp_path / "g.log").start()


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, max_lines=3) == "line 97\nline 98\nline 99"
    assert log_tail(tmp_path / "absent.log") == ""


def test_free_port_is_bindable_and_closed() -> None:
    port = free_port()
    assert 0 < port < 65536
    assert not port_open("127.0.0.1", port)
