"""`trialflow up`: SIGTERM stops everything it started, as Ctrl-C does; ports are
configurable; --no-vllm starts no vLLM; the S3 keys are printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from infra.process import free_port, port_open

pytestmark = [pytest.mark.temporal, pytest.mark.s3]


def test_up_no_vllm_custom_ports_and_sigterm(tmp_path):
    ports = {name: free_port() for name in ("temporal", "ui", "s3", "vllm")}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "250"}
    argv = [
        sys.executable, "-c", "from trialflow.cli import app; app()", "up", "--no-vllm",
        "--state-dir", str(tmp_path / "state"),
        "--temporal-port", str(ports["temporal"]), "--temporal-ui-port", str(ports["ui"]),
        "--s3-port", str(ports["s3"]), "--vllm-port", str(ports["vllm"]),
    ]  # fmt: skip
    log = tmp_path / "up.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "up; Ctrl-C or SIGTERM" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        text = log.read_text()
        assert f"127.0.0.1:{ports['temporal']}" in text and f":{ports['ui']}" in text
        assert "TRIALFLOW_S3_ACCESS_KEY=" in text and "TRIALFLOW_S3_SECRET_KEY=" in text
        assert "none (--no-vllm)" in text
        assert port_open("127.0.0.1", ports["temporal"]) and port_open("127.0.0.1", ports["s3"])
        assert not port_open("127.0.0.1", ports["vllm"])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
        assert not port_open("127.0.0.1", ports["temporal"]) and not port_open("127.0.0.1", ports["s3"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
