"""The `trialflow` CLI against REAL services: run (in-process worker), status, replay
--failed, inspect; plus settings precedence and the metrics endpoint."""

from __future__ import annotations

import json
import socket
import urllib.request
import uuid
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from trialflow.cli import app
from trialflow.metrics import TrialMetrics
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult
from trialflow.settings import load_settings

REPO = Path(__file__).resolve().parents[1]
GOOD = REPO / "examples" / "tasks" / "create-file"
BROKEN = REPO / "tests" / "trialflow" / "fixtures" / "tasks" / "broken-dockerfile"


@pytest.fixture(scope="module")
def cli_env(temporal_address, s3_endpoint, docker_client) -> dict[str, str]:
    from trialflow.sandbox.base_image import ensure_base_image

    ensure_base_image(docker_client)
    suffix = uuid.uuid4().hex[:8]
    return {
        "TRIALFLOW_TEMPORAL_ADDRESS": temporal_address,
        "TRIALFLOW_TASK_QUEUE": f"cli-{suffix}",
        "TRIALFLOW_S3_ENDPOINT": s3_endpoint.endpoint_url,
        "TRIALFLOW_S3_BUCKET": s3_endpoint.bucket,
        "TRIALFLOW_S3_PREFIX": f"cli-{suffix}",
        "TRIALFLOW_S3_ACCESS_KEY": s3_endpoint.access_key,
        "TRIALFLOW_S3_SECRET_KEY": s3_endpoint.secret_key,
        "TRIALFLOW_WORKER_ID": f"cli-{suffix}",
        "TRIALFLOW_DRAIN_GRACE_S": "5",
        "COLUMNS": "250",  # keep rich tables on one line per row
    }


def _invoke(env: dict[str, str], *args: str):
    return CliRunner().invoke(app, list(args), env=env, catch_exceptions=False)


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_run_status_replay_inspect(cli_env):
    batch_id = f"cli-{uuid.uuid4().hex[:6]}"
    run = _invoke(
        cli_env,
        "run",
        str(GOOD),
        str(BROKEN),
        "--scaffold",
        "oracle",
        "--batch-id",
        batch_id,
    )
    assert run.exit_code == 1, run.output  # the broken Dockerfile is an error
    good_id, broken_id = (
        f"trial-{batch_id}-create-file-0",
        f"trial-{batch_id}-broken-dockerfile-0",
    )
    assert good_id in run.output and "1.000" in run.output
    assert "ImageBuildFailed" in run.output

    status = _invoke(cli_env, "status", batch_id)
    assert status.exit_code == 0, status.output
    assert good_id in status.output and broken_id in status.output and "COMPLETED" in status.output

    replay = _invoke(cli_env, "replay", batch_id, "--failed")
    assert replay.exit_code == 1, replay.output  # still broken
    assert "rerunning 1 failed trial" in replay.output and f"{broken_id}-r1" in replay.output

    status = _invoke(cli_env, "status", batch_id)
    assert f"{broken_id}-r1" in status.output  # linked to its original in the same batch

    # a batch id that does not exist is an error, not an empty table
    for args in (("status", "no-such-batch"), ("replay", "no-such-batch", "--failed")):
        missing = _invoke(cli_env, *args)
        assert missing.exit_code == 1, missing.output
        assert "no trials of batch 'no-such-batch'" in missing.output, missing.output

    inspect = _invoke(cli_env, "inspect", good_id)
    assert inspect.exit_code == 0, inspect.output
    rows = {line.strip("│ ").split("│")[0].strip(): line for line in inspect.output.splitlines()}
    assert "1.000" in rows["reward"] and "submitted" in rows["termination"]
    assert "attempt 1: no trajectory (a model-free scaffold)" in inspect.output


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_skip_invalid_runs_the_rest_and_keeps_what_it_skipped(cli_env, tmp_path):
    from tests.trialflow.test_tasks import make_task

    bad = make_task(tmp_path / "needs-alpine", dockerfile="FROM alpine:3.22\n", solve_sh="true\n")
    batch_id = f"cli-{uuid.uuid4().hex[:6]}"
    refused = _invoke(cli_env, "run", str(GOOD), str(bad), "--batch-id", batch_id)
    assert refused.exit_code == 2 and "nothing submitted (1 problem)" in refused.output, refused.output
    assert "alpine:3.22 is not present locally" in refused.output
    run = _invoke(cli_env, "run", str(GOOD), str(bad), "--batch-id", batch_id, "--skip-invalid")
    assert run.exit_code == 0, run.output
    assert f"skipped: {bad}: environment/Dockerfile line 1: FROM alpine:3.22" in run.output
    assert f"trial-{batch_id}-create-file-0" in run.output and "1.000" in run.output
    assert "1 task(s) skipped before submit (--skip-invalid)" in run.output
    out = tmp_path / "report.html"
    report = _invoke(cli_env, "report", batch_id, "--out", str(out))
    assert report.exit_code == 0 and "1 tasks skipped" in report.output, report.output
    html = out.read_text()
    assert "Skipped before submit" in html and "needs-alpine" in html and "alpine:3.22" in html


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_rerunning_a_batch_attaches_to_its_trials(cli_env):
    batch_id = f"cli-again-{uuid.uuid4().hex[:6]}"
    first = _invoke(cli_env, "run", str(GOOD), "--batch-id", batch_id)
    second = _invoke(cli_env, "run", str(GOOD), "--batch-id", batch_id)
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    status = _invoke(cli_env, "status", batch_id)
    assert status.output.count(f"trial-{batch_id}-create-file-0") == 1


WRITER = """
import time

from trialflow.scaffolds import Scaffold, ScaffoldResult


class Writer(Scaffold):
    name = "writer"
    needs_model = False

    def __init__(self, *, text: str = "wrong") -> None:
        self.text = text

    async def run(self, ctx):
        started = time.monotonic()
        res = await ctx.sandbox.exec(f"printf '%s\\n' '{self.text}' > /app/hello.txt")
        return ScaffoldResult(res.exit_code, False, res.stdout, res.stderr, time.monotonic() - started)
"""


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_run_a_scaffold_given_by_import_path_with_options(cli_env, tmp_path, monkeypatch):
    """A scaffold that exists only in a temporary package: named by import path on the
    command line, its option carried in the TrialSpec to the (in-process) worker."""
    pkg = tmp_path / "tf_cli_agents"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "writer.py").write_text(WRITER)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = _invoke(
        cli_env,
        "run",
        str(GOOD),
        "--scaffold",
        "tf_cli_agents.writer:Writer",
        "--scaffold-option",
        "text=Hello, trialflow!",
    )
    assert run.exit_code == 0, run.output
    assert "1.000" in run.output and "submitted" in run.output  # the option reached the worker


def test_a_bad_scaffold_is_refused_before_submitting(tmp_path):
    # nothing listens at that address: it must not get that far; wide columns keep messages whole
    env = {"TRIALFLOW_TEMPORAL_ADDRESS": "127.0.0.1:1", "COLUMNS": "400"}
    for args, message in [
        (["--scaffold", "no_such_pkg.mod:Agent"], "cannot load scaffold"),
        (["--scaffold", "claude-code", "--scaffold-option", "max_turn=3"], "does not take options"),
        (["--scaffold", "claude-code", "--scaffold-option", "max_turns"], "is not KEY=VALUE"),
    ]:
        result = CliRunner().invoke(app, ["run", str(GOOD), *args], env=env)
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split())


def test_bad_network_options_and_settings_are_one_line_each():
    """A bad --allow-agent-host, a bad mode, a bad TRIALFLOW_* value: one error line, exit 2,
    no traceback, nothing submitted (nothing listens at the Temporal address)."""
    env = {"TRIALFLOW_TEMPORAL_ADDRESS": "127.0.0.1:1", "COLUMNS": "400"}
    for args, extra_env, message in [
        (["--allow-agent-host", "http://pypi.org"], {}, "setting agent_allowed_hosts"),
        (["--verifier-network", "open"], {}, "Invalid value for '--verifier-network'"),
        ([], {"TRIALFLOW_VERIFIER_ALLOWED_HOSTS": '["a.org:8080"]'}, "setting verifier_allowed_hosts"),
        ([], {"TRIALFLOW_SANDBOX_PIDS_LIMIT": "3"}, "setting sandbox_pids_limit"),
    ]:
        result = CliRunner().invoke(app, ["run", str(GOOD), *args], env={**env, **extra_env})
        assert result.exit_code == 2, result.output
        assert message in " ".join(result.output.split()) and "Traceback" not in result.output


def test_network_settings_become_the_runs_choice(monkeypatch):
    from workflows.shared import RunNetwork

    assert load_settings().run_network() == RunNetwork()  # agent no-network, verifier public
    monkeypatch.setenv("TRIALFLOW_VERIFIER_NETWORK", "no-network")
    monkeypatch.setenv("TRIALFLOW_AGENT_ALLOWED_HOSTS", '["PyPI.org.", "10.0.0.0/8"]')
    s = load_settings(agent_network_default="public")
    assert s.run_network() == RunNetwork(
        agent_default="public", verifier="no-network", agent_hosts=("pypi.org", "10.0.0.0/8")
    )


def test_replay_numbers_compare_numerically():
    from trialflow.batch import replay_number

    assert replay_number("trial-b-t-0", "trial-b-t-0") == 0
    assert (
        replay_number("trial-b-t-0", "trial-b-t-0-r10") == 10 > replay_number("trial-b-t-0", "trial-b-t-0-r9")
    )


def test_flags_override_environment(monkeypatch):
    monkeypatch.setenv("TRIALFLOW_TEMPORAL_ADDRESS", "env-host:1")
    monkeypatch.setenv("TRIALFLOW_REPLICA_URLS", json.dumps(["http://env:8000"]))
    monkeypatch.setenv("TRIALFLOW_MAX_CONCURRENT_TRIALS", "7")
    s = load_settings(temporal_address="flag-host:2", replica_urls=None)
    assert (s.temporal_address, s.replica_urls, s.max_concurrent_trials) == (
        "flag-host:2",
        ["http://env:8000"],
        7,
    )


def test_store_dir_flag_wins_over_an_s3_endpoint_in_the_environment(monkeypatch, tmp_path):
    from trialflow.cli._app import settings_from_flags
    from trialflow.storage import LocalStore, open_store

    monkeypatch.setenv("TRIALFLOW_S3_ENDPOINT", "http://127.0.0.1:9")
    assert settings_from_flags().s3_endpoint == "http://127.0.0.1:9"
    s = settings_from_flags(store_dir=tmp_path / "store")  # was: ignored, results went to S3
    assert s.s3_endpoint is None and isinstance(open_store(s), LocalStore)
    with pytest.raises(typer.BadParameter, match="not both"):
        settings_from_flags(store_dir=tmp_path, s3="http://127.0.0.1:9")


def test_run_says_where_results_go(tmp_path, monkeypatch):
    """The local directory store is never chosen silently: `run` prints this line."""
    from trialflow.cli._app import console, say_store
    from trialflow.settings import load_settings

    monkeypatch.delenv("TRIALFLOW_S3_ENDPOINT", raising=False)
    with console.capture() as cap:
        say_store(load_settings(store_dir=tmp_path / "st"))
    assert f"the local directory {tmp_path / 'st'}" in cap.get() and "TRIALFLOW_S3_ENDPOINT" in cap.get()


def test_worker_flags_parse_into_settings():
    import worker_main

    s = worker_main.parse_args(
        ["--replica-urls", "http://a", "--replica-urls", "http://b", "--extra-scaffolds", '{"x": "m:C"}',
         "--max-concurrent-trials", "2"]
    )  # fmt: skip
    assert s.replica_urls == ["http://a", "http://b"] and s.extra_scaffolds == {"x": "m:C"}
    assert s.max_concurrent_trials == 2


def test_metrics_endpoint_serves_trial_metrics():
    metrics = TrialMetrics()
    metrics.trials_completed.labels("submitted").inc()
    metrics.phase_seconds.labels("verify").observe(1.5)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    metrics.serve(port, addr="127.0.0.1")
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'trialflow_trials_completed_total{termination="submitted"} 1.0' in body
    assert 'trialflow_phase_seconds_count{phase="verify"} 1.0' in body
    assert "trialflow_trials_running 0.0" in body


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_worker_says_when_it_is_ready_and_drains_on_sigterm(cli_env):
    """`trialflow worker` was silent until its first trial; now it prints one ready line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    env = {**os.environ, **cli_env, "TRIALFLOW_TASK_QUEUE": f"{cli_env['TRIALFLOW_TASK_QUEUE']}-w"}
    env.pop("TRIALFLOW_MODEL_DIR", None)
    cmd = [sys.executable, "-c", "from trialflow.cli import app; app()", "worker"]
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline, lines = time.monotonic() + 120, []
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("worker ready:"):
                break
        ready = [line for line in lines if line.startswith("worker ready:")]
        assert ready, "".join(lines)
        assert env["TRIALFLOW_TASK_QUEUE"] in ready[0] and "no model" in ready[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


class SlowScaffold(Scaffold):
    """Test scaffold (by import path): sleeps in its sandbox long enough to be interrupted."""

    name = "test-slow"
    needs_model = False

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        res = await ctx.sandbox.exec("sleep 600", timeout_s=700)
        return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_ctrl_c_during_run_says_what_happens_to_the_trials(cli_env):
    import os
    import signal
    import subprocess
    import sys
    import time

    batch_id = f"int-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, **cli_env, "TRIALFLOW_TASK_QUEUE": f"{cli_env['TRIALFLOW_TASK_QUEUE']}-int"}
    cmd = [sys.executable, "-c", "from trialflow.cli import app; app()", "run", str(GOOD),
           "--scaffold", "tests.test_cli:SlowScaffold", "--batch-id", batch_id]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # wait until the batch is submitted
            seen.append(line)
            if "results go to" in line:
                break
        time.sleep(3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        output = "".join(seen) + out
        assert "interrupted: 0 of 1 trials finished" in output, output
        assert f"trialflow status {batch_id}" in output and "Traceback" not in output, output
        assert time.monotonic() - t0 < 60  # drain grace 5 s here
    finally:
        if proc.poll() is None:
            proc.kill()
