"""Who stopped the sandbox during the agent phase (activities.scaffold._stopped_by_agent), with
a small fake Sandbox: stopped but still there is the agent's outcome; gone or running is not."""

import pytest

from activities.scaffold import _stopped_by_agent
from trialflow.errors import SandboxLost
from trialflow.sandbox.base import Sandbox


class _StateSandbox(Sandbox):
    """Answers is_running with a fixed state ("running", "stopped" or "gone"); nothing else."""

    def __init__(self, state: str) -> None:
        self.state = state

    id = "fake"

    async def is_running(self):
        if self.state == "gone":
            raise SandboxLost("no such container")
        return self.state == "running"

    async def start(self):
        raise NotImplementedError

    async def exec(self, cmd, **kw):
        raise NotImplementedError

    async def upload(self, local_path, remote_dir):
        raise NotImplementedError

    async def download(self, remote_path, local_dir, *, allowance=None):
        raise NotImplementedError

    async def listen_loopback(self):
        raise NotImplementedError

    async def stop_processes(self):
        raise NotImplementedError

    async def restart_for_verification(self):
        raise NotImplementedError

    async def base_environment(self):
        raise NotImplementedError

    async def stop(self):
        raise NotImplementedError


async def test_a_sandbox_stopped_under_the_agent_is_its_outcome():
    lost = SandboxLost("sandbox x is not running")
    outcome = await _stopped_by_agent(_StateSandbox("stopped"), lost, 2.5)
    assert outcome.exit_code == 137 and not outcome.timed_out and outcome.duration_s == 2.5
    assert "verified from its files" in (outcome.detail or "") and "not running" in outcome.stderr


@pytest.mark.parametrize("state", ["running", "gone"])
async def test_a_removed_sandbox_or_one_still_running_stays_an_infrastructure_failure(state):
    lost = SandboxLost("engine unreachable")
    with pytest.raises(SandboxLost) as raised:
        await _stopped_by_agent(_StateSandbox(state), lost, 1.0)
    assert raised.value is lost
