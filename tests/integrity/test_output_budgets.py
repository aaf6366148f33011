"""Files from a sandbox over their budget (issue 20, 4), through the REAL path: Temporal,
the in-process worker, Docker sandboxes, SeaweedFS. The agent leaves a 1 GiB sparse file
in /logs/artifacts (Harbor's conventional artifacts dir); before the fix the worker read it
whole into memory (+1 GB RSS), wrote 2 GB of host disk, and in separate-verifier mode the
verify activity was cancelled and retried three times.

Asserted, in shared and separate verifier mode: the trial ends at once with the typed,
non-retried `OutputBudgetExceeded` recorded in its result (one attempt, verify phase); a
bystander trial running beside it keeps its reward and its duration (ratio to an idle run
of the same trial in this test, loose bound for a loaded 2-core machine); the worker's
memory and open files stay bounded; no temporary file or container is left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests._worker_fixtures import worker_settings
from tests.integrity._support import fd_count, peaks
from trialflow import batch
from trialflow.settings import TrialflowSettings

REPO = Path(__file__).resolve().parents[2]
BYSTANDER = REPO / "examples" / "tasks" / "create-file"

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client) -> TrialflowSettings:
    return worker_settings("budgets", temporal_address, s3_endpoint, docker_client, max_concurrent_trials=2)


def _flooding_task(root: Path, mode: str) -> Path:
    task = root / f"sparse-artifact-{mode}"
    shutil.copytree(BYSTANDER, task)
    toml = (task / "task.toml").read_text()
    if mode == "separate":
        toml = toml.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    (task / "task.toml").write_text(toml)
    solve = task / "solution" / "solve.sh"
    solve.write_text(solve.read_text() + "mkdir -p /logs/artifacts && truncate -s 1G /logs/artifacts/big\n")
    return task


def _leftovers() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith(("tf-", "trialflow-"))}


async def _timed(client, specs, queue):
    started = time.monotonic()
    results = await batch.run(client, specs, task_queue=queue)
    return results, time.monotonic() - started


@pytest.mark.parametrize("mode", ["shared", "separate"])
async def test_a_sparse_gigabyte_artifact_is_refused_and_the_neighbour_is_unharmed(
    tmp_path, client, settings, worker, no_leaked_sandboxes, mode
):
    batch_id = f"budget-{mode}-{uuid.uuid4().hex[:6]}"
    flooding = _flooding_task(tmp_path, mode)
    [warm, idle_spec, busy_spec] = [
        batch.make_specs(f"{batch_id}-{kind}", [BYSTANDER], "oracle")[0] for kind in ("warm", "idle", "busy")
    ]
    [flood_spec] = batch.make_specs(batch_id, [flooding], "oracle", attempt_limit=2)
    await _timed(client, [warm], settings.task_queue)  # builds the image, warms the worker
    [idle], idle_s = await _timed(client, [idle_spec], settings.task_queue)
    assert (idle.reward, idle.reward_valid) == (1.0, True)
    before_tmp = _leftovers()
    async with peaks(0.05) as seen:
        flood_run = asyncio.create_task(_timed(client, [flood_spec], settings.task_queue))
        [busy], busy_s = await _timed(client, [busy_spec], settings.task_queue)
        [flood], flood_s = await flood_run

    assert flood.termination_reason == "verifier_error" and not flood.reward_valid, flood
    assert flood.error is not None and flood.error.type == "OutputBudgetExceeded", flood.error
    assert flood.error.phase == "verify" and flood.error.non_retryable
    assert "'/logs/artifacts/big'" in flood.error.message and "1073741824" in flood.error.message
    assert len(flood.attempt_records) == 1  # no new attempt: the agent phase did not re-run
    assert flood_s < 60, flood_s  # refused by the tar header: no gigabyte read, no retry loop
    assert (busy.reward, busy.reward_valid) == (1.0, True)
    assert busy_s <= 3 * idle_s + 2, (busy_s, idle_s)
    assert seen.rss_growth_mib < 150, seen  # was +1 GB
    assert fd_count() <= seen.base_fds + 16, seen
    assert _leftovers() <= before_tmp


async def test_verifier_output_and_reward_files_over_their_limits(sandbox_for, tmp_path):
    """The verifier's side, on a real sandbox: a sparse 10 MiB reward.txt is an invalid
    reward (read no further than its limit); a sparse 1 GiB file in /logs/verifier is over
    the log budget (refused by its tar header; nothing of it on the host)."""
    from tests.trialflow.test_tasks import make_task
    from trialflow.errors import OutputBudgetExceeded
    from trialflow.tasks import load_task
    from trialflow.verifier import run_verifier

    big_reward = make_task(
        tmp_path / "big-reward",
        test_sh="echo 1 > /logs/verifier/reward.txt && truncate -s 10M /logs/verifier/reward.txt\n",
        dockerfile="FROM trialflow-base:bookworm\n",
    )
    task = load_task(big_reward)
    res = await run_verifier(await sandbox_for(task), task, log_dir=tmp_path / "logs")
    assert not res.reward_valid and "over the 65536-byte limit" in (res.reason or ""), res.reason
    flooding = make_task(
        tmp_path / "flooding-verifier",
        test_sh="echo 1 > /logs/verifier/reward.txt && truncate -s 1G /logs/verifier/huge.log\n",
        dockerfile="FROM trialflow-base:bookworm\n",
    )
    task = load_task(flooding)
    before = _leftovers()
    with pytest.raises(OutputBudgetExceeded, match="/logs/verifier/huge.log"):
        await run_verifier(await sandbox_for(task), task, log_dir=tmp_path / "logs2")
    on_disk = sum(p.stat().st_blocks * 512 for p in (tmp_path / "logs2").rglob("*") if p.is_file())
    assert on_disk < 1 << 20 and _leftovers() <= before


async def test_a_copy_without_an_allowance_of_its_own_gets_the_log_budget(sandbox_for, tmp_path):
    """What the scaffolds copy back (an agent's stdout/stderr files, `_read_logs`) and any
    other download: the backend's log limits; a sparse 1 GiB stdout is refused at its tar
    header, with its path in the error, and leaves nothing on the host."""
    from trialflow.errors import OutputBudgetExceeded
    from trialflow.tasks import load_task

    sb = await sandbox_for(load_task(BYSTANDER))
    res = await sb.exec(
        "mkdir -p /logs/agent && echo hi > /logs/agent/small.txt && truncate -s 1G /logs/agent/stdout.txt"
    )
    assert res.ok, res
    got = await sb.download("/logs/agent/small.txt", tmp_path / "ok")
    assert got.read_text() == "hi\n"
    async with peaks(0.02) as seen:
        with pytest.raises(OutputBudgetExceeded, match="/logs/agent/stdout.txt"):
            await sb.download("/logs/agent/stdout.txt", tmp_path / "big")
    assert not (tmp_path / "big" / "stdout.txt").exists() and seen.rss_growth_mib < 64, seen
