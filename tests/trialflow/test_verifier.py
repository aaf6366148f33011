"""Verifier: pure reward parsing, and real runs of the sample tasks' test.sh in Docker."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.trialflow.conftest import EXAMPLES
from trialflow.errors import RewardMissing, VerifierTimeout
from trialflow.tasks import load_task
from trialflow.verifier import (
    VerifierResult,
    parse_reward_json,
    parse_reward_txt,
    parse_rewards,
    run_verifier,
)


def test_reward_txt():
    assert parse_reward_txt(" 0.75\n") == {"reward": 0.75}
    assert parse_reward_txt("1") == {"reward": 1.0}
    for bad in ["", "one", "1 2", "nan", "inf"]:
        with pytest.raises(ValueError):
            parse_reward_txt(bad)


def test_reward_json():
    assert parse_reward_json('{"a": 1, "b": 0.5}') == {"a": 1.0, "b": 0.5}
    for bad, why in [
        ("[1]", "object"),
        ("{}", "empty"),
        ('{"a": true}', "not a number"),
        ('{"a": "1"}', "not a number"),
        ('{"a": NaN}', "not finite"),
        ("{", "not valid JSON"),
        ('{"a": null}', "not a number"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_reward_json(bad)


def test_json_wins_over_txt_and_neither_is_an_error():
    assert parse_rewards('{"x": 0.2}', "1") == {"x": 0.2}
    assert parse_rewards(None, "1") == {"reward": 1.0}
    with pytest.raises(ValueError, match="neither"):
        parse_rewards(None, None)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_finite_float_roundtrips_through_reward_txt(x):
    assert parse_reward_txt(repr(x)) == {"reward": x}


def _result(**kw) -> VerifierResult:
    base = {
        "rewards": {},
        "reward_valid": True,
        "reason": None,
        "exit_code": 0,
        "timed_out": False,
        "stdout": "",
        "stderr": "",
        "duration_s": 0.1,
    }
    return VerifierResult(**{**base, **kw})


def test_scalar_reward_and_error_classification():
    assert _result(rewards={"reward": 0.3, "x": 1}).reward == 0.3
    assert math.isclose(_result(rewards={"a": 1, "b": 0.5}).reward, 0.75)
    assert _result(rewards={"reward": 1}, reward_valid=False, reason="r").reward == 0.0
    assert _result().error() is None
    assert isinstance(_result(reward_valid=False, reason="slow", timed_out=True).error(), VerifierTimeout)
    err = _result(reward_valid=False, reason="no file").error()
    assert isinstance(err, RewardMissing) and str(err) == "no file"


@pytest.mark.docker
async def test_nop_state_gets_reward_zero(sandbox_for, tmp_path):
    task = load_task(EXAMPLES / "create-file")
    sb = await sandbox_for(task)
    res = await run_verifier(sb, task, log_dir=tmp_path / "logs")
    assert res.reward_valid and res.rewards == {"reward": 0.0} and res.files == {"reward.txt": "0\n"}
    assert "FAIL" in res.stdout
    assert (tmp_path / "logs" / "reward.txt").read_text() == "0\n"


@pytest.mark.docker
async def test_stale_reward_files_are_removed_before_running(sandbox_for):
    task = load_task(EXAMPLES / "verifier-error")
    sb = await sandbox_for(task)
    await sb.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
    res = await run_verifier(sb, task)
    assert not res.reward_valid and res.rewards == {}


@pytest.mark.docker
async def test_verifier_crash_is_reward_missing_with_output_kept(sandbox_for):
    task = load_task(EXAMPLES / "verifier-error")
    sb = await sandbox_for(task)
    res = await run_verifier(sb, task)
    assert not res.reward_valid and res.exit_code == 1 and not res.timed_out
    assert "neither /logs/verifier/reward.json nor /logs/verifier/reward.txt" in res.reason
    assert "starting checks" in res.stdout and "FileNotFoundError" in res.stderr
    assert isinstance(res.error(), RewardMissing)


@pytest.mark.docker
async def test_verifier_timeout(sandbox_for):
    task = load_task(EXAMPLES / "verifier-timeout")
    sb = await sandbox_for(task)
    await sb.exec("echo done > /app/done.txt")
    res = await run_verifier(sb, task)
    assert res.timed_out and not res.reward_valid and res.rewards == {}
    assert 3.0 <= res.duration_s < 15 and "timed out after 3s" in res.reason
    assert "checking slowly" in res.stdout
    assert isinstance(res.error(), VerifierTimeout)


@pytest.mark.docker
async def test_timeout_override_and_garbage_reward(sandbox_for, tmp_path):
    from tests.trialflow.test_tasks import make_task

    root = make_task(
        tmp_path / "garbage",
        test_sh='echo \'{"a": "high"}\' > /logs/verifier/reward.json\n',
        dockerfile="FROM trialflow-base:bookworm\n",
    )
    task = load_task(root)
    sb = await sandbox_for(task)
    res = await run_verifier(sb, task, timeout_s=20)
    assert not res.reward_valid and "not a number" in res.reason
    assert res.files == {"reward.json": '{"a": "high"}\n'}


@pytest.mark.docker
async def test_verifier_env_and_user(sandbox_for, tmp_path):
    from tests.trialflow.test_tasks import make_task

    toml = '[verifier]\nuser = "nobody"\nenv = { VALUE = "0.25" }\n'
    root = make_task(
        tmp_path / "envuser", toml, test_sh='id -un; echo "$VALUE" > /logs/verifier/reward.txt\n'
    )
    task = load_task(root)
    sb = await sandbox_for(task)
    res = await run_verifier(sb, task)
    assert res.reward_valid and res.rewards == {"reward": 0.25} and res.stdout == "nobody\n"
