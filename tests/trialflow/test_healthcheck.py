"""Harbor's healthcheck rules (BaseEnvironment.run_healthcheck), on a fake clock."""

from __future__ import annotations

import pytest

from trialflow.errors import HealthcheckFailed
from trialflow.healthcheck import run_healthcheck
from trialflow.sandbox.base import ExecResult
from trialflow.task_config import HealthcheckConfig


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def _runner(outcomes: list[int], clock: Clock, took: float = 0.0):
    calls: list[tuple[str, float]] = []

    async def run(cmd: str, timeout_s: float) -> ExecResult:
        calls.append((cmd, timeout_s))
        clock.now += took
        code = outcomes.pop(0) if outcomes else 1
        return ExecResult(code, "", "not yet" if code else "", False, took)

    return run, calls


async def test_passes_at_first_success():
    clock = Clock()
    run, calls = _runner([0], clock)
    hc = HealthcheckConfig(command="true", timeout_sec=7.9)
    assert await run_healthcheck(hc, run, clock=clock, sleep=clock.sleep) == 1
    assert calls == [("true", 7.0)]  # Harbor passes int(timeout_sec)


async def test_retries_consecutive_failures_then_fails():
    clock = Clock()
    run, calls = _runner([1, 1, 1, 0], clock)
    hc = HealthcheckConfig(command="c", retries=3, interval_sec=2)
    with pytest.raises(HealthcheckFailed, match="after 3 consecutive retries.*3 tries"):
        await run_healthcheck(hc, run, clock=clock, sleep=clock.sleep)
    assert len(calls) == 3 and clock.sleeps == [2, 2]


async def test_failures_in_the_start_period_do_not_count():
    clock = Clock()
    # start period 10 s, start interval 3 s: tries at t=0,3,6,9 are free; t=12 counts.
    run, calls = _runner([1, 1, 1, 1, 1, 0], clock)
    hc = HealthcheckConfig(command="c", start_period_sec=10, start_interval_sec=3, interval_sec=5, retries=2)
    assert await run_healthcheck(hc, run, clock=clock, sleep=clock.sleep) == 6
    assert clock.sleeps == [3, 3, 3, 3, 5]


async def test_start_period_is_judged_at_the_start_of_a_try():
    """A try that starts inside the start period and fails is free even if it ends after it."""
    clock = Clock()
    run, _ = _runner([1, 1], clock, took=4.0)
    hc = HealthcheckConfig(command="c", start_period_sec=3, start_interval_sec=1, retries=1)
    with pytest.raises(HealthcheckFailed):
        await run_healthcheck(hc, run, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == [1]  # first failure free (start interval), second counted -> fail


async def test_zero_retries_fails_on_the_first_counted_failure():
    clock = Clock()
    run, calls = _runner([1, 0], clock)
    with pytest.raises(HealthcheckFailed):
        await run_healthcheck(HealthcheckConfig(command="c", retries=0), run, clock=clock, sleep=clock.sleep)
    assert len(calls) == 1
