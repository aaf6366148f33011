"""Multi-step tasks (`[[steps]]`) end to end, as Harbor 0.25 runs them: a real worker
(Temporal, Docker, S3) runs the oracle on examples/tasks/log-pipeline and on variants of it
written here (a step whose solution falls short, a failing setup.sh, each reward strategy).

The sample's three steps: "filter" (the shared tests/ and solution/), "count" (its workdir/
and setup.sh append log lines first; its own tests over the shared ones; gate
`min_reward = { exact = 1.0 }`), "summary". Each step's oracle solution solves it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import uuid
from pathlib import Path

import pytest

from tests._worker_fixtures import worker_settings
from trialflow import batch
from trialflow.display import steps_text
from trialflow.inspection import verifier_logs
from trialflow.settings import TrialflowSettings
from trialflow.storage import TrialKeys, open_store
from workflows.shared import TrialResult

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "examples" / "tasks" / "log-pipeline"

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]

# "count" solved for the first 3 of its 5 lines: reward 0.6, exact 0.
SHORT_COUNT = "#!/bin/bash\nprintf '200 4\\n404 1\\n500 2\\n' > /app/counts.txt\n"
# "summary" solved, and what the agent could see of earlier steps' grading kept as an artifact.
PEEKING_SUMMARY = (
    "#!/bin/bash\n"
    "{ ls -A /tests; ls -A /logs/verifier; } > /app/seen.txt 2>&1\n"
    "echo 'total=9 errors=4' > /app/summary.txt\n"
)


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client) -> TrialflowSettings:
    return worker_settings("steps", temporal_address, s3_endpoint, docker_client, max_concurrent_trials=3)


def variant(
    root: Path, name: str, *, toml: dict[str, str] | None = None, files: dict[str, str] | None = None
) -> Path:
    """A copy of the sample with task.toml edits (regex -> replacement) and replaced files."""
    task = root / name
    shutil.copytree(SAMPLE, task)
    text = (task / "task.toml").read_text()
    for pattern, repl in (toml or {}).items():
        text, n = re.subn(pattern, repl, text, flags=re.MULTILINE)
        assert n == 1, pattern
    (task / "task.toml").write_text(text)
    for rel, content in (files or {}).items():
        (task / rel).write_text(content)
    return task


async def run(client, settings, tasks: list[Path]) -> dict[str, TrialResult]:
    specs = batch.make_specs(f"steps-{uuid.uuid4().hex[:6]}", tasks, "oracle", attempt_limit=1)
    return {r.task_name: r for r in await batch.run(client, specs, task_queue=settings.task_queue)}


def steps(result: TrialResult) -> list[tuple[str, dict[str, float], str | None]]:
    return [(s.name, s.rewards, s.stopped) for s in result.step_results]


async def test_oracle_passes_every_step_of_the_sample(client, settings, worker, no_leaked_sandboxes):
    [r] = (await run(client, settings, [SAMPLE])).values()
    assert (r.reward, r.reward_valid, r.termination_reason, r.error) == (1.0, True, "submitted", None), r
    assert steps(r) == [
        ("filter", {"reward": 1.0}, None),
        ("count", {"reward": 1.0, "exact": 1.0}, None),
        ("summary", {"reward": 1.0}, None),
    ]
    assert r.rewards == {"exact": pytest.approx(1 / 3), "reward": 1.0}  # mean: exact only in "count"
    assert all(s.termination_reason == "submitted" for s in r.step_results)
    assert set(r.timings) == {"setup", "step_setup", "scaffold", "verify", "teardown"}
    # Each step's logs live under its own keys: the verifier output of "count" is its own.
    store = open_store(settings)
    keys = TrialKeys(r.batch_id, r.trial_id, 1, "2-count")
    assert "hits=5/5 exact=1" in store.get_bytes(keys.log("verifier/stdout.txt")).decode()
    stored = TrialResult.model_validate_json(store.get_bytes(r.result_uri or ""))
    assert stored.step_results == r.step_results
    assert stored.result_uri == r.result_uri  # the stored result names itself
    # `inspect` and the report show every step's verifier output, not only the last one's.
    logs = verifier_logs(store, r)
    assert "hits=5/5 exact=1" in logs["step 2 count · stdout.txt"]
    assert {name.split(" · ")[0] for name in logs} == {"step 1 filter", "step 2 count", "step 3 summary"}
    assert all(s.network_modes == {"agent": "no-network", "verifier": "public"} for s in r.step_results)


async def test_gate_strategy_and_step_setup_rules(client, settings, worker, no_leaked_sandboxes, tmp_path):
    short = {"steps/count/solution/solve.sh": SHORT_COUNT}
    no_gate = {r"^min_reward = \{ exact = 1.0 \}\n": ""}
    tasks = [
        # the "count" gate fails: "summary" never runs
        variant(tmp_path, "gated", files=short),
        # no gate on "count": all three run; the strategies combine the same steps differently
        variant(
            tmp_path, "mean", toml=no_gate, files=short | {"steps/summary/solution/solve.sh": PEEKING_SUMMARY}
        ),
        variant(tmp_path, "final", toml=no_gate | {'"mean"': '"final"'}, files=short),
        # "count"'s own agent timeout (2 s) ends its slow agent: an outcome, still verified and gated
        variant(
            tmp_path,
            "slow",
            toml={r"^timeout_sec = 120.0$": "timeout_sec = 2.0"},
            files={"steps/count/solution/solve.sh": "#!/bin/bash\nsleep 60\n"},
        ),
        # setup.sh of "count" fails: its agent never runs, the sequence stops there
        variant(
            tmp_path,
            "setup-fails",
            files={"steps/count/workdir/setup.sh": "#!/bin/bash\necho nope >&2; exit 4\n"},
        ),
    ]
    # The artifact shows what the "summary" agent saw of the earlier steps' grading.
    text = (
        (tasks[1] / "task.toml")
        .read_text()
        .replace(
            '[[steps]]\nname = "summary"\n', '[[steps]]\nname = "summary"\nartifacts = ["/app/seen.txt"]\n'
        )
    )
    (tasks[1] / "task.toml").write_text(text)
    results = await run(client, settings, tasks)

    gated = results["gated"]
    assert steps(gated) == [
        ("filter", {"reward": 1.0}, None),
        ("count", {"reward": 0.6, "exact": 0.0}, "exact=0 below min_reward 1"),
    ]
    assert (gated.rewards, gated.reward, gated.termination_reason) == (
        {"reward": 0.8, "exact": 0.0},
        0.8,
        "submitted",
    )

    # `trialflow status` shows the steps from the workflow's memo (visibility lags a little).
    for _ in range(50):
        listed = await batch.list_trials(client, gated.batch_id)
        if any(t.steps for t in listed):
            break
        await asyncio.sleep(0.2)
    [status] = [t for t in listed if t.workflow_id == gated.trial_id]
    assert (
        steps_text(status.steps)
        == "filter 1.000 · count 0.600 (reward=0.6, exact=0) stopped: exact=0 below min_reward 1"
    )

    mean, final = results["mean"], results["final"]
    for r in (mean, final):
        assert [(n, rw.get("reward")) for n, rw, _ in steps(r)] == [
            ("filter", 1.0),
            ("count", 0.6),
            ("summary", 1.0),
        ]
    assert mean.rewards == {"reward": pytest.approx(2.6 / 3), "exact": 0.0}
    assert mean.reward == pytest.approx(2.6 / 3)
    assert (final.rewards, final.reward) == ({"reward": 1.0}, 1.0)  # the last step verbatim

    slow = results["slow"]
    assert [(s.name, s.termination_reason, s.stopped) for s in slow.step_results] == [
        ("filter", "submitted", None),
        ("count", "timeout", "exact=0 below min_reward 1"),
    ]
    assert slow.step_results[1].timings["scaffold"] < 30  # 2 s, not the task's 300 s or the sleep
    assert slow.termination_reason == "timeout"

    failed = results["setup-fails"]
    assert [(s.name, s.stopped) for s in failed.step_results] == [
        ("filter", None),
        ("count", "step set-up failed"),
    ]
    count = failed.step_results[-1]
    assert count.termination_reason is None and count.error is not None
    assert count.error.type == "StepSetupFailed" and "exited with code 4" in count.error.message
    # mean over the steps with a reward: "filter" alone
    assert (failed.reward, failed.reward_valid, failed.termination_reason) == (1.0, True, "setup_error")

    # The "summary" agent ran after two verifiers in its sandbox and saw none of their files.
    store = open_store(settings)
    keys = TrialKeys(mean.batch_id, mean.trial_id, 1, "3-summary")
    assert store.get_bytes(keys.log("artifacts/app/seen.txt")).decode() == ""
    manifest = json.loads(store.get_bytes(keys.log("artifacts/manifest.json")))
    assert any(e.get("source") == "/app/seen.txt" for e in manifest)
