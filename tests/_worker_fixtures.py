"""Fixtures for suites that run real trials through an in-process worker.

Loaded for every test by ``pytest_plugins`` in tests/conftest.py; a module that uses them
defines its own module-scoped ``settings`` fixture (a ``TrialflowSettings`` with its own task
queue, S3 prefix and worker id).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

import worker_main
from trialflow import batch


@pytest.fixture(scope="module")
async def client(settings):
    return await batch.connect(settings.temporal_address)


@pytest.fixture(scope="module")
async def worker(settings, client) -> AsyncIterator[worker_main.WorkerProcess]:
    process = await worker_main.build(settings, client)
    stop = asyncio.Event()
    task = asyncio.create_task(process.run(stop))
    yield process
    stop.set()
    await task


@pytest.fixture
def no_leaked_sandboxes(docker_client, worker) -> Iterator[None]:
    """No container of THIS worker outlives a test (other sessions share the engine)."""
    yield
    mine = docker_client.containers.list(all=True, filters={"label": f"trialflow.worker={worker.host_queue}"})
    assert not mine, f"sandboxes left behind: {[c.name for c in mine]}"
