"""The oracle solves every solvable sample task; nop solves none (real Docker + verifier)."""

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.errors import TaskInvalid
from trialflow.scaffolds import ScaffoldContext, get_scaffold
from trialflow.tasks import load_task
from trialflow.verifier import run_verifier

pytestmark = pytest.mark.docker

EXPECTED_ORACLE = {
    "compose-services": {"reward": 1.0},
    "create-file": {"reward": 1.0},
    "fix-bug": {"reward": 1.0},
    "multi-step": {"reward": 1.0},
    "reward-json": {"correctness": 1.0, "style": 1.0, "efficiency": 1.0},
}


async def _trial(sandbox_for, name: str, scaffold: str):
    task = load_task(EXAMPLES / name)
    sb = await sandbox_for(task)
    beats = []
    ctx = ScaffoldContext(sandbox=sb, task=task, timeout_s=120, heartbeat=beats.append)
    result = await get_scaffold(scaffold).run(ctx)
    return result, await run_verifier(sb, task), beats


@pytest.mark.parametrize("name", sorted(EXPECTED_ORACLE))
async def test_oracle_solves(sandbox_for, name):
    result, verdict, beats = await _trial(sandbox_for, name, "oracle")
    assert result.exit_code == 0 and not result.timed_out, result.log
    assert verdict.reward_valid, verdict.reason
    assert verdict.rewards == EXPECTED_ORACLE[name]
    assert verdict.reward == 1.0 and beats == [{"phase": "solve"}]


@pytest.mark.parametrize("name", sorted(EXPECTED_ORACLE))
async def test_nop_solves_nothing(sandbox_for, name):
    result, verdict, _ = await _trial(sandbox_for, name, "nop")
    assert result.exit_code == 0
    assert verdict.reward_valid and verdict.reward == 0.0
    assert all(v == 0.0 for v in verdict.rewards.values())


@pytest.mark.parametrize(("name", "timed_out"), [("verifier-timeout", True), ("verifier-error", False)])
async def test_failure_mode_tasks_give_invalid_rewards_even_when_solved(sandbox_for, name, timed_out):
    result, verdict, _ = await _trial(sandbox_for, name, "oracle")
    assert result.exit_code == 0
    assert not verdict.reward_valid and verdict.timed_out is timed_out and verdict.reason


async def test_oracle_without_solution_is_task_invalid(sandbox_for, tmp_path):
    from tests.trialflow.test_tasks import make_task

    task = load_task(make_task(tmp_path / "nosol"))
    sb = await sandbox_for(task)
    with pytest.raises(TaskInvalid, match="solution/solve.sh"):
        await get_scaffold("oracle").run(ScaffoldContext(sandbox=sb, task=task))


async def test_oracle_timeout_is_reported(sandbox_for, tmp_path):
    from tests.trialflow.test_tasks import make_task

    task = load_task(make_task(tmp_path / "slowsol", solve_sh="sleep 60\n"))
    sb = await sandbox_for(task)
    ctx = ScaffoldContext(sandbox=sb, task=task, timeout_s=1)
    assert ctx.instruction == task.instruction
    result = await get_scaffold("oracle").run(ctx)
    assert result.timed_out and result.exit_code != 0
