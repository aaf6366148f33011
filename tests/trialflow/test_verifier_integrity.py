"""The verifier against an agent that attacks its own reward (real Docker): a daemon left
behind rewriting reward.txt, a replaced `cat`, a planted reward with a replaced `rm`."""

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.tasks import load_task
from trialflow.verifier import run_verifier

pytestmark = pytest.mark.docker

DAEMON = (
    "mkdir -p /logs/verifier && setsid nohup bash -c "
    "'while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; sleep 0.01; done' >/dev/null 2>&1 & echo ok"
)


async def test_a_daemon_left_behind_cannot_rewrite_the_reward(sandbox_for):
    task = load_task(EXAMPLES / "create-file")
    sb = await sandbox_for(task)
    assert (await sb.exec(DAEMON, timeout_s=30)).ok
    result = await run_verifier(sb, task)
    assert result.reward_valid and result.reward == 0.0, result
    assert "FAIL" in result.stdout


async def test_a_replaced_cat_cannot_forge_the_reward(sandbox_for):
    task = load_task(EXAMPLES / "create-file")
    sb = await sandbox_for(task)
    forged = "printf '#!/bin/sh\\necho 1\\n' > /bin/cat && chmod +x /bin/cat && cat /nothing"
    assert (await sb.exec(forged, user="0")).stdout.strip() == "1"
    result = await run_verifier(sb, task)
    assert result.reward_valid and result.reward == 0.0, result
    assert result.files == {"reward.txt": "0\n"}


async def test_a_planted_reward_is_removed_whatever_rm_the_agent_left(sandbox_for):
    # verifier-error's test.sh crashes before writing a reward: only a planted one could count.
    task = load_task(EXAMPLES / "verifier-error")
    sb = await sandbox_for(task)
    plant = (
        "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt && "
        "printf '#!/bin/sh\\nexit 0\\n' > /bin/rm && chmod +x /bin/rm"
    )
    assert (await sb.exec(plant, user="0")).ok
    result = await run_verifier(sb, task)
    assert not result.reward_valid and result.reward == 0.0
    # The toolchain's rm ran, not the replaced one: the planted reward is gone and the
    # honest outcome (test.sh crashed before writing one) stands.
    assert "wrote neither" in (result.reason or ""), result.reason
