"""The sandbox backend registry (trialflow.sandbox.registry) and the worker running the backend
its settings name (`sandbox_backend`, plugins by import path in `extra_sandbox_backends`).

`RecordingBackend` is a TEST DOUBLE of a plugin backend: it creates no sandbox (no trial
runs here) and records what the worker did with it, so that the test can see which backend
the worker built, with which labels, that its reaper and admission used it and that its exit
closed it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
from typer.testing import CliRunner

from tests._worker_fixtures import worker_settings
from tests.trialflow.conftest import EXAMPLES
from trialflow.cli import app
from trialflow.errors import SandboxStartFailed, UnknownSandboxBackend
from trialflow.sandbox import DockerBackend, ReapReport, Sandbox, SandboxBackend
from trialflow.sandbox.registry import available_backends, backend_class, check_backend
from trialflow.settings import TrialflowSettings, load_settings

PLUGIN = {"test-recording": f"{__name__}:RecordingBackend"}


class RecordingBackend(SandboxBackend):
    """Test double of a plugin backend (see the module docstring)."""

    built: list[RecordingBackend] = []

    def __init__(self, settings: TrialflowSettings, labels: Mapping[str, str]) -> None:
        self.settings, self.labels = settings, dict(labels)
        self.reaps: list[float] = []
        self.pings = 0
        self.reaped, self.pinged = asyncio.Event(), asyncio.Event()
        self._loop = asyncio.get_running_loop()  # built by the worker, on its loop
        self.closed = False

    @classmethod
    def from_settings(cls, settings: TrialflowSettings, *, labels: Mapping[str, str]) -> RecordingBackend:
        backend = cls(settings, labels)
        cls.built.append(backend)
        return backend

    async def create(self, task, *, trial_id, labels=None, mounts=(), verifier_for=None) -> Sandbox:
        raise SandboxStartFailed("RecordingBackend creates no sandboxes")

    async def attach(self, sandbox_id: str) -> Sandbox:
        raise SandboxStartFailed("RecordingBackend has no sandboxes")

    async def reap(self, older_than_s: float) -> ReapReport:
        self.reaps.append(older_than_s)
        self.reaped.set()
        return ReapReport()

    def ping(self) -> None:
        self.pings += 1  # in admission's thread: tell the loop from there
        self._loop.call_soon_threadsafe(self.pinged.set)

    def close(self) -> None:
        self.closed = True


class NotABackend:
    pass


def test_docker_is_the_default_and_registered():
    assert load_settings().sandbox_backend == "docker"
    assert backend_class("docker") is DockerBackend
    assert "docker" in available_backends()


def test_an_unknown_backend_lists_the_names_available():
    with pytest.raises(UnknownSandboxBackend) as err:
        backend_class("kubernetes")
    assert isinstance(err.value, KeyError)
    assert (
        str(err.value)
        == f"unknown sandbox backend 'kubernetes'; available: {', '.join(available_backends())}"
    )
    assert "docker" in str(err.value)


def test_plugins_register_by_import_path_and_bad_ones_say_why():
    settings = load_settings(sandbox_backend="test-recording", extra_sandbox_backends=PLUGIN)
    assert check_backend(settings) is RecordingBackend
    assert "test-recording" in available_backends()
    for target, message in [
        ("no_such_pkg.mod:Backend", "cannot load sandbox backend 'test-broken': ModuleNotFoundError"),
        (f"{__name__}:Missing", "cannot load sandbox backend 'test-broken': AttributeError"),
        (f"{__name__}:NotABackend", "'test-broken' is not a trialflow.sandbox.SandboxBackend subclass"),
    ]:
        broken = load_settings(sandbox_backend="test-broken", extra_sandbox_backends={"test-broken": target})
        with pytest.raises(UnknownSandboxBackend, match=message):
            check_backend(broken)


def test_a_bad_backend_is_one_line_before_anything_starts():
    # nothing listens at that address: the CLI must refuse before connecting
    env = {"TRIALFLOW_TEMPORAL_ADDRESS": "127.0.0.1:1", "COLUMNS": "400"}
    worker = CliRunner().invoke(app, ["worker"], env={**env, "TRIALFLOW_SANDBOX_BACKEND": "nope"})
    assert worker.exit_code == 2 and "Traceback" not in worker.output, worker.output
    assert "unknown sandbox backend 'nope'; available: docker" in " ".join(worker.output.split())
    good = str(EXAMPLES / "create-file")
    run = CliRunner().invoke(app, ["run", good, "--backend", "nope"], env=env)
    assert run.exit_code == 2 and "unknown sandbox backend 'nope'" in " ".join(run.output.split()), run.output
    external = CliRunner().invoke(app, ["run", good, "--backend", "docker", "--external-worker"], env=env)
    assert external.exit_code == 2, external.output
    assert "--backend is for the in-process worker" in " ".join(external.output.split())


async def test_the_worker_runs_the_backend_its_settings_name(temporal_address, s3_endpoint, docker_client):
    from trialflow import batch
    from trialflow.cli._worker import WorkerProcess

    settings = worker_settings(
        "backend-registry",
        temporal_address,
        s3_endpoint,
        docker_client,
        sandbox_backend="test-recording",
        extra_sandbox_backends=PLUGIN,
        admission_interval_s=0.1,
    )
    client = await batch.connect(settings.temporal_address)
    RecordingBackend.built.clear()
    async with WorkerProcess(settings, client) as worker:
        backend = worker.backend
        assert RecordingBackend.built == [backend]
        assert backend.settings is settings
        assert backend.labels == {"trialflow.worker": worker.host_queue}  # reaps only its own
        # the reaper at start; admission's engine-latency signal
        await asyncio.wait_for(asyncio.gather(backend.reaped.wait(), backend.pinged.wait()), 60)
        # (at start: what this host queue left, reap(0); then the leaks older than reap_after_s)
        assert set(backend.reaps) <= {0, settings.reap_after_s} and backend.pings >= 1
        assert not backend.closed
    assert backend.closed
