"""The `openhands` scaffold's pure parts: its runner's output fold, its endings, its
command and mounts (the real runs are `TestOpenHands` in test_scaffold_contract.py)."""

from __future__ import annotations

import json

import pytest

from trialflow.errors import ScaffoldSetupFailed
from trialflow.scaffolds.openhands import MOUNT_AT, RUNNER_AT, OpenHandsScaffold, summarize_events

LIMIT = "\n".join(
    [
        json.dumps({"event": "MessageEvent"}),
        "stray text",
        json.dumps({"event": "ActionEvent", "tool_name": "terminal"}),
        json.dumps({"event": "ConversationErrorEvent", "code": "MaxIterationsReached"}),
        json.dumps(
            {"op": "done", "status": "error", "error_code": "MaxIterationsReached", "error": "limit (1)."}
        ),
    ]
)


def test_iteration_limit_is_max_turns():
    summary = summarize_events(LIMIT)
    assert (summary.events, summary.actions, summary.bad_lines) == (4, 1, 1)
    scaffold = OpenHandsScaffold()
    assert scaffold.stop_reason(summary) == "max_turns"
    assert scaffold.detail(summary) == "MaxIterationsReached: limit (1)."


def test_finished_run_has_no_stop_reason_or_detail():
    summary = summarize_events(json.dumps({"op": "done", "status": "finished"}))
    scaffold = OpenHandsScaffold()
    assert summary.status == "finished"
    assert scaffold.stop_reason(summary) is None and scaffold.detail(summary) is None


def test_a_missing_root_says_run_setup(tmp_path):
    with pytest.raises(ScaffoldSetupFailed, match="infra/setup.sh"):
        OpenHandsScaffold(root=tmp_path).mounts()


def test_bad_max_turns_is_rejected():
    with pytest.raises(ValueError, match="max_turns"):
        OpenHandsScaffold(max_turns=0)


def test_command_runs_the_roots_python_through_its_own_loader(tmp_path):
    from types import SimpleNamespace

    scaffold = OpenHandsScaffold(max_turns=7, model_args={"temperature": 0.5})
    ctx = SimpleNamespace(instruction="do it", openai_base_url="http://127.0.0.1:9/v1", model="tiny")
    run = scaffold.command(ctx)  # type: ignore[arg-type]
    assert run.argv[0] == f"{MOUNT_AT}/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"
    assert run.argv[1:3] == ["--library-path", f"{MOUNT_AT}/usr/lib/x86_64-linux-gnu"]
    assert run.argv[5] == RUNNER_AT
    config = json.loads(run.argv[6])
    assert config["max_turns"] == 7 and config["model_args"] == {"temperature": 0.5}
    assert config["base_url"] == "http://127.0.0.1:9/v1" and config["model"] == "tiny"
    assert run.env["PYTHONHOME"] == f"{MOUNT_AT}/usr"
    with pytest.raises(ScaffoldSetupFailed):
        scaffold.command(SimpleNamespace(instruction="x", openai_base_url=None, model="tiny"))  # type: ignore[arg-type]
