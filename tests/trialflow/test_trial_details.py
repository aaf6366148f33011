"""trialflow.trial_details: what the Temporal UI shows of a trial (pure markdown)."""

from __future__ import annotations

import re

from trialflow import trial_details
from workflows.shared import AttemptRecord, TrialError, TrialProgress, TrialResult, TrialSpec

SPEC = TrialSpec(
    batch_id="b1", task_path="/t/fix-bug", task_name="fix-bug", scaffold="claude-code", sample_index=2
)


def _result(**fields) -> TrialResult:
    return TrialResult.of(SPEC, termination_reason="submitted", **fields)


def test_the_outcome_search_attribute():
    assert trial_details.outcome(_result(reward=0.0, reward_valid=True)) == "ok"  # a 0 is an outcome
    assert trial_details.outcome(_result(reward_valid=False, reward_error="no reward file")) == "invalid"
    error = TrialError(type="SandboxLost", message="gone", phase="scaffold", attempt=1)
    assert trial_details.outcome(_result(reward_valid=False, error=error)) == "error"
    assert trial_details.failing_query("b1") == 'TrialBatchId = "b1" AND TrialOutcome != "ok"'
    url = trial_details.workflows_ui_url(trial_details.failing_query("b1"), "http://ui:1/")
    assert url == (
        "http://ui:1/namespaces/default/workflows?query="
        "TrialBatchId+%3D+%22b1%22+AND+TrialOutcome+%21%3D+%22ok%22"
    )


def test_live_details_name_the_trials_attempt_turns_and_tokens():
    progress = TrialProgress(
        phase="scaffold", attempt=2, turns=4, prompt_tokens=12345, response_tokens=678, host_queue="h1"
    )
    assert trial_details.live_details(progress, SPEC) == (
        "**scaffold** · trial attempt 2/3 on `h1` · turn 4 · 12,345 prompt / 678 generated tokens"
    )
    assert trial_details.live_details(TrialProgress(phase="setup", attempt=1), SPEC) == (
        "**setup** · trial attempt 1/3"
    )


def test_final_details_say_how_it_went_and_where_the_records_are():
    lost = AttemptRecord.begun(1, "s3://b/a1/")
    done = AttemptRecord.begun(2, "s3://b/a2/").finished("s3://b/a2/trajectory.npz")
    text = trial_details.final_details(
        _result(
            reward=1.0, reward_valid=True, turns=5, replayed_turns=2, generated_turns=3,
            prompt_tokens=900, response_tokens=80, attempts=2, attempt_records=[lost, done],
            result_uri="s3://b/result.json",
        ),
        SPEC,
    )  # fmt: skip
    assert text.splitlines()[:5] == [
        "### reward 1.000 (valid) · submitted",
        "turns 5 (2 replayed, 3 generated) · 900 prompt / 80 generated tokens · 2 attempts",
        "attempt 1 trajectory: `s3://b/a1/checkpoints/` (checkpoints only: lost)",
        "attempt 2 trajectory: `s3://b/a2/trajectory.npz`",
        "result: `s3://b/result.json`",
    ]
    assert "`trialflow replay trial-b1-fix-bug-2 --from-record --model-dir DIR`" in text
    assert "(http://127.0.0.1:8234/trial/trial-b1-fix-bug-2?batch=b1)" in text
    # a model-free trial left no record to re-run
    assert "--from-record" not in trial_details.final_details(_result(reward_valid=True), SPEC)


def test_what_the_agent_wrote_stays_text():
    """An error's message carries the scaffold's stderr: the agent must not put a link, an
    image (fetched by whoever opens the page) or HTML into the rendered details."""
    attack = (
        "![x](http://evil.example/p.png) <img src=http://evil.example/q> [click](http://evil.example)\n# h"
    )
    error = TrialError(type="ScaffoldExit", message=attack, phase="scaffold", attempt=1)
    text = trial_details.final_details(_result(reward_valid=False, reward_error=attack, error=error), SPEC)
    for markup in (r"!\[x", r"\[click", "<img", "# h"):  # none of it unescaped
        assert not re.search(r"(?<!\\)" + markup, text), (markup, text)
    assert r"http://evil\.example/p\.png" in text  # still readable, as text
