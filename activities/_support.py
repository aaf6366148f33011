"""Helpers shared by the activity classes: typed-error conversion and background heartbeats.

Errors: a `TrialflowError` becomes ``ApplicationError(message, type=<class name>,
non_retryable=not retryable)`` so the workflow's retry policies and its result keep the
type name from trialflow/errors.py. Anything else propagates unchanged (Temporal treats
it as retryable).

`phase_network`: the workflow's `RunNetwork` as the sandbox layer's `PhaseNetwork`.

Heartbeats: `heartbeating(details)` heartbeats every `interval_s` while its block runs, so
a long blocking step (an image build in a thread) still proves the worker alive. `details`
is called each time and may return None (heartbeat without details).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from trialflow.errors import TrialflowError
from trialflow.sandbox.network import Phase, PhaseNetwork
from workflows.shared import RunNetwork


def phase_network(run: RunNetwork, phase: Phase) -> PhaseNetwork:
    """The run's say in `phase`'s network (`trialflow.sandbox.network.resolve_network`)."""
    if phase == "agent":
        return PhaseNetwork(run.agent_default, run.agent, run.agent_hosts)
    return PhaseNetwork(run.verifier_default, run.verifier, run.verifier_hosts)


def application_error(err: TrialflowError) -> ApplicationError:
    return ApplicationError(str(err), type=type(err).__name__, non_retryable=not err.retryable)


@contextlib.contextmanager
def typed_errors():
    """Re-raise a TrialflowError as the matching ApplicationError."""
    try:
        yield
    except TrialflowError as err:
        raise application_error(err) from err


@contextlib.asynccontextmanager
async def heartbeating(
    details: Callable[[], Any] | None = None, interval_s: float = 5.0
) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            value = details() if details else None
            if value is None:
                activity.heartbeat()
            else:
                activity.heartbeat(value)
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def heartbeat_interval(default_s: float = 5.0) -> float:
    """A third of the activity's heartbeat timeout (if any), capped at `default_s`."""
    timeout = activity.info().heartbeat_timeout
    if timeout is None:
        return default_s
    return max(0.2, min(default_s, timeout.total_seconds() / 3))
