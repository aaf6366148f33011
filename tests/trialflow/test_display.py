"""What users see of outcomes: one-line causes, invalid rewards never shown as 0, reward
components, ANSI stripped, verifier output in `inspect` and the report, one-line errors."""

from __future__ import annotations

from typer.testing import CliRunner

from trialflow.cli import app
from trialflow.display import mean_valid, reward_text, steps_text, strip_ansi, why
from trialflow.errors import ImageBuildFailed
from trialflow.inspection import verifier_logs
from trialflow.report import render_report
from trialflow.storage import LocalStore, TrialKeys, trial_result_key
from workflows.shared import StepResult, TrialError, TrialResult


def _r(trial_id="trial-b-t-0", **kw) -> TrialResult:
    base = dict(
        trial_id=trial_id,
        batch_id="b",
        task_name="t",
        scaffold="oracle",
        sample_index=0,
        termination_reason="submitted",
        reward_valid=True,
        reward=1.0,
        rewards={"reward": 1.0},
        attempts=1,
    )
    return TrialResult(**{**base, **kw})  # fmt: skip


def test_strip_ansi():
    assert strip_ansi("\x1b[31mFAILED\x1b[0m test_x \x1b]0;title\x07ok\x1b[2K") == "FAILED test_x ok"


def test_why_is_the_cause_not_the_build_log():
    err = ImageBuildFailed("task t: docker build failed: exit code 2", "Step 1/3 : FROM trialflow-base\nboom")
    r = _r(error=TrialError(type="ImageBuildFailed", message=str(err), phase="setup"), reward_valid=False)
    assert why(r) == "ImageBuildFailed: task t: docker build failed: exit code 2"
    assert (
        why(_r(reward_valid=False, reward_error="RewardMissing: \x1b[1mno\x1b[0m\nreward"))
        == "RewardMissing: no reward"
    )


def test_invalid_reward_is_never_a_zero_and_components_are_shown():
    assert reward_text(_r(reward_valid=False, reward=0.0)) == "invalid"
    assert reward_text(_r(rewards={"tests": 1.0, "style": 0.0}, reward=0.5)) == "0.500 (tests=1, style=0)"
    assert reward_text(_r()) == "1.000"
    assert mean_valid(
        [_r(), _r(reward=0.0, rewards={"reward": 0.0}), _r(reward_valid=False, reward=0.0)]
    ) == (0.5, 1)
    assert mean_valid([_r(reward_valid=False)]) == (None, 1)


def _store_with_logs(tmp_path) -> LocalStore:
    store = LocalStore(tmp_path / "store")
    r = _r(reward_valid=False, reward=0.0, reward_error="RewardMissing: no reward file")
    store.put_bytes(trial_result_key("b", r.trial_id), r.model_dump_json().encode())
    keys = TrialKeys("b", r.trial_id, 1)
    store.put_bytes(keys.log("verifier/stdout.txt"), b"\x1b[32m3 passed\x1b[0m, 1 failed\n")
    store.put_bytes(keys.log("verifier/files/test-output.xml"), b"<testsuite failures='1'/>")
    return store


def test_verifier_output_in_inspect_and_report(tmp_path):
    store = _store_with_logs(tmp_path)
    r = _r(reward_valid=False, reward=0.0)
    logs = verifier_logs(store, r)
    assert logs == {
        "files/test-output.xml": "<testsuite failures='1'/>",
        "stdout.txt": "3 passed, 1 failed\n",
    }
    html = render_report([r], verifier_logs={r.trial_id: logs})
    assert "Verifier output" in html and "3 passed, 1 failed" in html and "&lt;testsuite" in html
    out = CliRunner().invoke(
        app,
        ["inspect", r.trial_id, "--batch-id", "b", "--store-dir", str(tmp_path / "store")],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    assert (
        "verifier: stdout.txt" in out.output
        and "3 passed, 1 failed" in out.output
        and "\x1b[32m" not in out.output
    )


def test_a_multi_step_trials_verifier_output_step_by_step(tmp_path):
    """Each step's verifier output under its own name (in the order the steps ran), each
    step's logs named; the stored result names itself and each phase's network."""
    store = LocalStore(tmp_path / "store")
    steps = [
        StepResult(name="plan", reward_valid=True, reward=1.0, rewards={"reward": 1.0},
                   termination_reason="submitted", logs_uri="file:///s/1-plan/logs/"),
        StepResult(name="build it", reward_valid=True, reward=0.0, rewards={"reward": 0.0},
                   termination_reason="submitted", logs_uri="file:///s/2-build_it/logs/"),
    ]  # fmt: skip
    r = _r(step_results=steps, result_uri="file:///s/result.json",
           network_modes={"agent": "no-network", "verifier": "public"},
           network_origins={"agent": "default", "verifier": "task"})  # fmt: skip
    store.put_bytes(trial_result_key("b", r.trial_id), r.model_dump_json().encode())
    for key, text in (("1-plan", "plan graded"), ("2-build_it", "build \x1b[31mfailed\x1b[0m")):
        store.put_bytes(TrialKeys("b", r.trial_id, 1, key).log("verifier/stdout.txt"), text.encode())
    store.put_bytes(TrialKeys("b", r.trial_id, 1, "2-build_it").log("verifier/files/junit.xml"), b"<x/>")
    logs = verifier_logs(store, r)
    assert list(logs) == [
        "step 1 plan · stdout.txt",
        "step 2 build it · files/junit.xml",
        "step 2 build it · stdout.txt",
    ]
    assert logs["step 2 build it · stdout.txt"] == "build failed"
    html = render_report([r], verifier_logs={r.trial_id: logs})
    assert "step 1 plan · stdout.txt" in html and "plan graded" in html
    out = CliRunner().invoke(
        app,
        ["inspect", r.trial_id, "--batch-id", "b", "--store-dir", str(tmp_path / "store")],
        env={"COLUMNS": "200"},
    )
    assert out.exit_code == 0, out.output
    for seen in (
        "verifier: step 1 plan · stdout.txt",
        "plan graded",
        "verifier: step 2 build it · stdout.txt",
        "logs file:///s/1-plan/logs/",
        "logs file:///s/2-build_it/logs/",
        "per step (above)",
        "file:///s/result.json",
        "agent no-network (default), verifier public (task)",
    ):
        assert seen in out.output, seen


def test_unknown_ids_give_one_line(tmp_path):
    store_dir = str(_store_with_logs(tmp_path).root)
    out = CliRunner().invoke(app, ["inspect", "trial-nope", "--batch-id", "b", "--store-dir", store_dir])
    assert out.exit_code == 1 and out.output.strip().startswith(
        "error: no stored result for trial 'trial-nope'"
    )
    assert len(out.output.strip().splitlines()) == 1 and "Traceback" not in out.output
    out = CliRunner().invoke(
        app, ["report", "nobatch", "--store-dir", store_dir, "--out", str(tmp_path / "r.html")]
    )
    assert out.exit_code == 1 and out.output.startswith("error: no results stored for batch 'nobatch'")


def test_inspect_and_report_find_the_store_the_batch_used(tmp_path, monkeypatch):
    from trialflow import batch_index
    from trialflow.settings import load_settings

    monkeypatch.setenv("TRIALFLOW_BATCH_INDEX", str(tmp_path / "index"))
    store = _store_with_logs(tmp_path)
    batch_index.record(load_settings(store_dir=store.root, s3_endpoint=None), "b")
    # No --store-dir, no --batch-id, no Temporal: the record says where batch b lives.
    monkeypatch.chdir(tmp_path)
    out = CliRunner().invoke(app, ["inspect", "trial-b-t-0", "--temporal-address", "127.0.0.1:1"])
    assert out.exit_code == 0, out.output
    assert "3 passed, 1 failed" in out.output
    out = CliRunner().invoke(app, ["report", "b", "--out", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    assert (
        batch_index.batch_of_trial("trial-b-t-0") == "b" and batch_index.batch_of_trial("trial-c-t-0") is None
    )


STEPS = [
    StepResult(
        name="filter", rewards={"reward": 1.0}, reward=1.0, reward_valid=True, termination_reason="submitted"
    ),
    StepResult(
        name="count",
        rewards={"reward": 0.6, "exact": 0.0},
        reward=0.6,
        reward_valid=True,
        termination_reason="timeout",
        stopped="exact=0 below min_reward 1",
        trajectory_uri="file:///s/attempt-1/steps/2-count/trajectory.npz",
    ),
]


def test_steps_text_names_each_step_and_where_the_sequence_stopped():
    assert steps_text([]) == ""
    assert (
        steps_text(STEPS)
        == "filter 1.000 · count 0.600 (reward=0.6, exact=0) stopped: exact=0 below min_reward 1"
    )
    failed = StepResult(name="b", stopped="step set-up failed")  # its agent never ran
    invalid = StepResult(name="c", reward_error="RewardMissing: none", termination_reason="submitted")
    assert steps_text([failed, invalid]) == "b set-up failed stopped: step set-up failed · c invalid"


def test_steps_in_the_results_table_report_and_inspect(tmp_path):
    from rich.console import Console

    from trialflow.cli._views import results_table

    r = _r(
        step_results=STEPS,
        rewards={"reward": 0.8, "exact": 0.0},
        reward=0.8,
        multi_step_reward_strategy="mean",
    )
    console = Console(width=250, record=True)
    console.print(results_table([r]))
    assert "count 0.600 (reward=0.6, exact=0) stopped: exact=0 below min_reward 1" in console.export_text()
    assert "stopped: exact=0 below min_reward 1" in render_report([r])
    from trialflow.batch import TrialStatus
    from trialflow.cli._views import status_table

    status = TrialStatus(r.trial_id, "COMPLETED", "t", 0.8, "submitted", True, None, r.rewards, tuple(STEPS))
    console = Console(width=250, record=True)
    console.print(status_table([status], "b"))
    assert "filter 1.000 · count 0.600 (reward=0.6, exact=0) stopped:" in console.export_text()
    store = LocalStore(tmp_path / "store")
    store.put_bytes(trial_result_key("b", r.trial_id), r.model_dump_json().encode())
    out = CliRunner().invoke(
        app,
        ["inspect", r.trial_id, "--batch-id", "b", "--store-dir", str(store.root)],
        env={"COLUMNS": "250"},
    )
    assert out.exit_code == 0, out.output
    assert (
        "count: 0.600 (reward=0.6, exact=0) (timeout, 0 turns); stopped: exact=0 below min_reward 1"
        in out.output
    )
    assert "steps/2-count/trajectory.npz" in out.output and "reward strategy" in out.output
