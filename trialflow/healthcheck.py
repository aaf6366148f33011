"""[environment.healthcheck]: the readiness gate between sandbox start and the agent,
with Harbor 0.25's rules (`BaseEnvironment.run_healthcheck`, Docker HEALTHCHECK-like):

- run `command` (through the shell, as the image's default user) with `timeout_sec`
  (truncated to whole seconds, as Harbor does); exit 0 passes at once;
- a failure while the start period lasts (`start_period_sec` from the first check; the
  check's START time is what counts) does not count; the next try follows after
  `start_interval_sec`;
- after the start period, `retries` consecutive failures fail the gate
  (`HealthcheckFailed`, the task's fault: never retried); tries are `interval_sec` apart.
  `retries = 0` fails on the first counted failure, as in Harbor.

`clock` and `sleep` are injectable so the rules are tested without waiting.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from trialflow.errors import HealthcheckFailed
from trialflow.sandbox.base import ExecResult
from trialflow.task_config import HealthcheckConfig

RunCheck = Callable[[str, float], Awaitable[ExecResult]]


async def run_healthcheck(
    hc: HealthcheckConfig,
    run: RunCheck,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> int:
    """Gate on `hc`; returns how many tries it took. `run(command, timeout_s)` runs one try."""
    start_period_end = clock() + hc.start_period_sec
    failures = tries = 0
    last: ExecResult | None = None
    while True:
        in_start_period = clock() < start_period_end
        tries += 1
        last = await run(hc.command, float(int(hc.timeout_sec)))
        if last.ok:
            return tries
        if in_start_period:
            await sleep(hc.start_interval_sec)
            continue
        failures += 1
        if failures >= hc.retries:
            detail = (last.stderr or last.stdout).strip()[-300:]
            how = "timed out" if last.timed_out else f"exit code {last.exit_code}"
            raise HealthcheckFailed(
                f"healthcheck failed after {hc.retries} consecutive retries ({tries} tries, last: {how}"
                + (f": {detail}" if detail else "")
                + f"): {hc.command}"
            )
        await sleep(hc.interval_sec)
