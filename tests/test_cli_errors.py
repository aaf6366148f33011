"""Every error a user can cause is one line, never a traceback: the real `trialflow` CLI in a
subprocess (what a user's terminal shows: stdout and stderr together, the exit code) against
REAL services (Temporal, SeaweedFS with keys, Docker).

The list walked (issue 24): inspect / report with missing or wrong S3 keys (a wrong key must
not say "create bucket failed"), status with Temporal down, unknown ids (`status nope`,
`replay nope --failed`), a bad sampling flag, and a set-up failure in `run` (the in-process
worker's failure warning used to print its traceback; the results table says it, the log
file has the traceback). Output piped into a log: progress lines, tables not cut at 80
columns."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOOD = REPO / "examples" / "tasks" / "create-file"
BROKEN = REPO / "tests" / "trialflow" / "fixtures" / "tasks" / "broken-dockerfile"


def _cli(env: dict[str, str], *args: str, cwd: Path = REPO, timeout: float = 600) -> tuple[int, str]:
    """(exit code, everything it printed) of ``trialflow ARGS``, its output a pipe (not a terminal)."""
    proc = subprocess.run(
        [sys.executable, "-c", "from trialflow.cli import app; app()", *args],
        env={k: v for k, v in env.items() if v is not None},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout


def _one_error_line(code: int, out: str) -> str:
    assert code == 1, out
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, out
    return errors[0]


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def env(temporal_address, s3_endpoint, tmp_path_factory) -> dict[str, str]:
    suffix = uuid.uuid4().hex[:8]
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRIALFLOW_")}
    return {
        **base,
        "HOME": str(tmp_path_factory.mktemp("home")),  # no batch index of other runs
        "TRIALFLOW_TEMPORAL_ADDRESS": temporal_address,
        "TRIALFLOW_TASK_QUEUE": f"errors-{suffix}",
        "TRIALFLOW_S3_ENDPOINT": s3_endpoint.endpoint_url,
        "TRIALFLOW_S3_BUCKET": s3_endpoint.bucket,
        "TRIALFLOW_S3_PREFIX": f"errors-{suffix}",
        "TRIALFLOW_S3_ACCESS_KEY": s3_endpoint.access_key,
        "TRIALFLOW_S3_SECRET_KEY": s3_endpoint.secret_key,
        "TRIALFLOW_WORKER_ID": f"errors-{suffix}",
        "TRIALFLOW_DRAIN_GRACE_S": "5",
    }


@pytest.mark.s3
@pytest.mark.parametrize("command", ["inspect", "report"])
def test_wrong_or_missing_s3_keys_are_one_line(env, command, tmp_path):
    args = ["inspect", "trial-b-x-0", "--batch-id", "b"] if command == "inspect" else ["report", "b"]
    wrong = {**env, "TRIALFLOW_S3_SECRET_KEY": "not-the-key"}
    line = _one_error_line(*_cli(wrong, *args, cwd=tmp_path))
    assert "refused the keys" in line and "create bucket" not in line, line
    missing = {**env, "TRIALFLOW_S3_ACCESS_KEY": None, "TRIALFLOW_S3_SECRET_KEY": None}
    missing.update(AWS_SHARED_CREDENTIALS_FILE="/nonexistent", AWS_CONFIG_FILE="/nonexistent")
    line = _one_error_line(*_cli(missing, *args, cwd=tmp_path))
    assert "S3" in line and "create bucket" not in line, line


def test_status_with_temporal_down_is_one_line(tmp_path):
    env = {**os.environ, "TRIALFLOW_TEMPORAL_ADDRESS": f"127.0.0.1:{_dead_port()}"}
    line = _one_error_line(*_cli(env, "status", "some-batch", cwd=tmp_path))
    assert "cannot reach Temporal" in line, line


@pytest.mark.temporal
def test_unknown_ids_exit_1_with_one_line(env, tmp_path):
    for args in (("status", "nope"), ("replay", "nope", "--failed", "--external-worker")):
        line = _one_error_line(*_cli(env, *args, cwd=tmp_path))
        assert "'nope'" in line, line


def test_a_bad_sampling_flag_is_one_usage_line(tmp_path):
    code, out = _cli(dict(os.environ), "run", str(GOOD), "--temperature", "-1", cwd=tmp_path)
    assert code == 2 and "Traceback" not in out and "--temperature" in out, out


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_a_set_up_failure_in_run_is_its_row_not_a_traceback(env, docker_client, tmp_path):
    from trialflow.sandbox.base_image import ensure_base_image

    ensure_base_image(docker_client)
    batch_id = f"errors-{uuid.uuid4().hex[:6]}"
    code, out = _cli(
        {**env, "COLUMNS": "80"},
        "run", str(GOOD), str(BROKEN), "--scaffold", "oracle", "--batch-id", batch_id,
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 1, out
    assert "Traceback" not in out, out
    # piped: a progress line per finished trial, and the table's rows not folded at 80 columns
    good, broken = f"trial-{batch_id}-create-file-0", f"trial-{batch_id}-broken-dockerfile-0"
    assert any(line.startswith("[") and f"{good}: 1.000 submitted" in line for line in out.splitlines()), out
    assert any(broken in line and "ImageBuildFailed" in line and "│" in line for line in out.splitlines()), (
        out
    )
    assert max(len(line) for line in out.splitlines()) > 80
    # the UI links `run` prints, and the worker log that holds what the terminal leaves out
    assert "invalid or errored trials: http://" in out, out
    (log_line,) = [line for line in out.splitlines() if line.startswith("in-process worker log: ")]
    log = (tmp_path / log_line.removeprefix("in-process worker log: ")).read_text()
    assert "ImageBuildFailed" in log


def test_run_takes_the_session_sampling():
    """`run --max-tokens 256 --temperature 0.5 --stop END` becomes the trial's sampling (every
    turn of its session; None fields keep the session default); a bad one is typer's usage error."""
    import typer

    from trialflow.cli._trials import sampling_from_flags

    sampling = sampling_from_flags(
        max_tokens=256, temperature=0.5, top_p=None, top_k=None, seed=None, stop=["END"]
    )
    assert sampling.overrides() == {"max_tokens": 256, "temperature": 0.5, "stop": ("END",)}
    with pytest.raises(typer.BadParameter) as err:
        sampling_from_flags(max_tokens=0, temperature=None, top_p=None, top_k=None, seed=None, stop=None)
    assert err.value.param_hint == "--max-tokens"
