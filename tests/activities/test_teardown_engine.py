"""The teardown activity says what it removed (issue 23): a sandbox on another engine (the
fallback teardown of a lost host's sandbox, run by a worker elsewhere) is not touched and is
reported as not removed, never as a success; one on this engine is removed; an absent one is
reported absent. A small fake backend and sandbox (tests/activities/test_stopped_by_agent's)."""

from __future__ import annotations

from activities.sandbox import SandboxActivities
from tests.activities.test_stopped_by_agent import _StateSandbox
from trialflow.errors import SandboxLost
from trialflow.metrics import TrialMetrics
from trialflow.sandbox.base import ReapReport, SandboxBackend
from workflows.shared import TeardownInput


class _Removable(_StateSandbox):
    def __init__(self, backend: _Engine) -> None:
        super().__init__("running")
        self._backend = backend

    async def stop(self) -> None:
        self._backend.sandboxes.discard(self.id)


class _Engine(SandboxBackend):
    """One engine holding sandbox ids; `attach` of another id is SandboxLost, as Docker's."""

    def __init__(self, engine: str, *sandboxes: str) -> None:
        self.engine, self.sandboxes = engine, set(sandboxes)

    @classmethod
    def from_settings(cls, settings, *, labels) -> _Engine:
        raise NotImplementedError("built by the test, not from settings")

    async def create(self, task, *, trial_id, labels=None, mounts=(), verifier_for=None):
        raise NotImplementedError

    async def attach(self, sandbox_id: str) -> _Removable:
        if sandbox_id not in self.sandboxes:
            raise SandboxLost(f"sandbox {sandbox_id} no longer exists")
        return _Removable(self)

    async def reap(self, older_than_s: float) -> ReapReport:
        return ReapReport()

    async def engine_id(self) -> str | None:
        return self.engine


def _teardown(engine_id: str | None) -> TeardownInput:
    return TeardownInput(batch_id="b", trial_id="t", attempt=1, sandbox_id="fake", engine_id=engine_id)


def _activities(backend: _Engine) -> SandboxActivities:
    return SandboxActivities(backend, lambda key: f"file:///{key}", "q", TrialMetrics())


async def test_a_sandbox_on_another_engine_is_left_and_reported_not_removed():
    elsewhere = _Engine("engine-B", "fake")  # an id that happens to exist here too
    out = await _activities(elsewhere).teardown(_teardown("engine-A"))
    assert out.removed is False and "engine-A" in out.note and "lease" in out.note
    assert elsewhere.sandboxes == {"fake"}  # untouched


async def test_on_its_own_engine_it_is_removed_and_an_absent_one_is_said_absent():
    engine = _Engine("engine-A", "fake")
    out = await _activities(engine).teardown(_teardown("engine-A"))
    assert out.removed is True and engine.sandboxes == set()
    again = await _activities(engine).teardown(_teardown("engine-A"))  # a retried teardown
    assert again.removed is False and "absent" in again.note
    legacy = await _activities(_Engine("engine-A", "fake")).teardown(_teardown(None))  # a recorded input
    assert legacy.removed is True
