"""README's "Using it" commands, as written: every ``.venv/bin/trialflow ...`` line of its bash
block is read from the README (continuation lines joined, comments dropped) and run by the
real CLI in a subprocess against REAL services (Temporal, SeaweedFS, Docker), the
placeholders (BATCH, TRIAL_ID, DIR, URL) filled with what the earlier commands made.

Run for real: `run examples/tasks/* --scaffold oracle --samples 2` (the shell's glob), `status
BATCH`, `replay BATCH --failed` (the two broken-verifier tasks' trials), `inspect TRIAL_ID`,
`report BATCH --out report.html` and `worker` (until its ready line, then SIGTERM). Parsed
by the CLI but not run here, each for a reason: `up` binds the fixed ports 7233/8233/8333/8000
of a machine the test suite shares (tests/test_cli_up.py starts it on its own ports); the
claude-code `run` needs `up`'s 64K-context vLLM (Claude Code's prompt alone is ~41K tiny-model
tokens; the demo runs it); `replay --from-record` needs a model-driven trial's record
(tests/test_resume_replay.py); `proxy` binds port 8100 and `view` port 8234 (their own tests serve
them on free ports: tests/proxy, tests/trialflow/viewer/test_browser.py).
"""

from __future__ import annotations

import glob
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import typer

REPO = Path(__file__).resolve().parents[1]
NOT_RUN = {"up", "proxy", "view"}


def readme_commands() -> list[list[str]]:
    """argv (after ``trialflow``) of every command line of README's "Using it" bash block."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Using it") :]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README's 'Using it' has no bash block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    commands = []
    for line in lines:
        if not line.startswith(".venv/bin/trialflow "):
            continue
        argv = shlex.split(line, comments=True)
        commands.append(argv[1:])
    assert len(commands) >= 8, commands
    return commands


def test_every_readme_command_parses():
    """Each command and its flags exist as the README writes them."""
    from trialflow.cli import app

    group = typer.main.get_command(app)
    for argv in readme_commands():
        command = group.get_command(group.context_class(group), argv[0])  # type: ignore[attr-defined]
        assert command is not None, argv
        filled = [
            {"BATCH": "b", "TRIAL_ID": "t", "DIR": "/tmp", "URL": "http://127.0.0.1:1"}.get(a, a)
            for a in argv
        ]
        command.parse_args(command.context_class(command), filled[1:])  # raises on an unknown flag


def _cli(env: dict[str, str], argv: list[str], cwd: Path) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-c", "from trialflow.cli import app; app()", *argv],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200,
    )  # fmt: skip
    return proc.returncode, proc.stdout


@pytest.mark.temporal
@pytest.mark.docker
@pytest.mark.s3
def test_readme_commands_run_as_written(temporal_address, s3_endpoint, docker_client, tmp_path):
    from trialflow.sandbox.base_image import ensure_base_image

    ensure_base_image(docker_client)
    suffix = uuid.uuid4().hex[:8]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TRIALFLOW_")},
        "HOME": str(tmp_path),  # the batch index `run` keeps for inspect/report
        "TRIALFLOW_TEMPORAL_ADDRESS": temporal_address,
        "TRIALFLOW_TASK_QUEUE": f"readme-{suffix}",
        "TRIALFLOW_S3_ENDPOINT": s3_endpoint.endpoint_url,
        "TRIALFLOW_S3_BUCKET": s3_endpoint.bucket,
        "TRIALFLOW_S3_PREFIX": f"readme-{suffix}",
        "TRIALFLOW_S3_ACCESS_KEY": s3_endpoint.access_key,
        "TRIALFLOW_S3_SECRET_KEY": s3_endpoint.secret_key,
        "TRIALFLOW_WORKER_ID": f"readme-{suffix}",
        "TRIALFLOW_DRAIN_GRACE_S": "5",
    }
    values: dict[str, str] = {}
    ran = []
    # 2 samples of every sample task; oracle solves all but the two broken-verifier tasks (invalid)
    trials = 2 * len(glob.glob(str(REPO / "examples" / "tasks" / "*" / "task.toml")))
    for argv in readme_commands():
        name = argv[0]
        if name in NOT_RUN or "--from-record" in argv or "claude-code" in argv:
            continue
        if name == "worker":
            _ready_then_stop(env)
            ran.append(name)
            continue
        # the shell expands the glob (relative to the repository root, where README runs)
        argv = [p for a in argv for p in (sorted(glob.glob(str(REPO / a))) if "*" in a else [a])]
        argv = [values.get(a, a) for a in argv]
        assert not {"BATCH", "TRIAL_ID"} & set(argv), f"{name} ran before a command made its id: {argv}"
        code, out = _cli(env, argv, tmp_path)
        assert "Traceback" not in out, out
        ran.append(name)
        if name == "run":
            batch = re.search(r"^batch (\S+): \d+ trials$", out, re.M)
            assert batch, out
            values["BATCH"] = batch.group(1)
            values["TRIAL_ID"] = f"trial-{batch.group(1)}-create-file-0"
            # every task x 2 samples, one progress line each (piped); the two broken-verifier tasks
            # end invalid, not as errors: exit 0
            progress = [line for line in out.splitlines() if re.match(rf"\[\d+/{trials}\] trial-", line)]
            assert code == 0 and len(progress) == trials, out
            assert sum(": invalid verifier_error" in line for line in progress) == 4, out
        elif name == "status":
            assert code == 0 and out.count("COMPLETED") == trials, out
        elif name == "replay":
            assert "rerunning 4 failed trial(s)" in out, out
        elif name == "inspect":
            assert code == 0 and values["TRIAL_ID"] in out, out
        elif name == "report":
            assert code == 0 and (tmp_path / "report.html").is_file(), out
    assert ran == ["run", "status", "replay", "inspect", "report", "worker"], ran


def _ready_then_stop(env: dict[str, str]) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "from trialflow.cli import app; app()", "worker"],
        env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        deadline, lines = time.monotonic() + 180, []
        while time.monotonic() < deadline and not any(line.startswith("worker ready:") for line in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        assert any(line.startswith("worker ready:") for line in lines), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
