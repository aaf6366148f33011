"""Fixtures for suites that run real trials through an in-process worker.

Loaded for every test by ``pytest_plugins`` in tests/conftest.py; a module that uses them
defines its own module-scoped ``settings`` fixture (a ``TrialflowSettings`` with its own task
queue, S3 prefix and worker id).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from trialflow import batch
from trialflow.worker import WorkerProcess

REPO = Path(__file__).resolve().parents[1]


def start_worker_process(env: dict[str, str], worker_id: str, log: Path) -> subprocess.Popen:
    """``python worker_main.py --worker-id ID`` in the repo root, output to ``log`` (the crash
    tests SIGKILL these)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, str(REPO / "worker_main.py"), "--worker-id", worker_id],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.fixture(scope="module")
async def client(settings):
    return await batch.connect(settings.temporal_address)


@pytest.fixture(scope="module")
async def worker(settings, client) -> AsyncIterator[WorkerProcess]:
    async with WorkerProcess(settings, client) as process:
        yield process


@pytest.fixture
def no_leaked_sandboxes(docker_client, worker) -> Iterator[None]:
    """No container of THIS worker outlives a test (other sessions share the engine)."""
    yield
    mine = docker_client.containers.list(all=True, filters={"label": f"trialflow.worker={worker.host_queue}"})
    assert not mine, f"sandboxes left behind: {[c.name for c in mine]}"
