"""The worker process module (trialflow/cli/_worker.py) after its move into the entry layer."""

from __future__ import annotations

import subprocess
import sys

from trialflow.cli import _worker

REPO = _worker.REPO_ROOT


def test_the_build_id_still_hashes_the_workflow_and_activity_sources(tmp_path, monkeypatch):
    """`build_id` globs workflows/ and activities/ under REPO_ROOT: a wrong root after the
    move would hash nothing and give every checkout the same build id."""
    assert (REPO / "workflows" / "trial.py").is_file() and (REPO / "activities" / "scaffold.py").is_file()
    here = _worker.build_id()
    (tmp_path / "workflows").mkdir()
    (tmp_path / "workflows" / "trial.py").write_text("# another workflow\n")
    monkeypatch.setattr(_worker, "REPO_ROOT", tmp_path)
    assert _worker.build_id() != here


def test_worker_main_still_starts_from_the_repo_root():
    """`python worker_main.py` (what the crash tests and deployments run) imports the moved
    module; --help exits before connecting anywhere."""
    out = subprocess.run(
        [sys.executable, "worker_main.py", "--help"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--temporal-address" in out.stdout
