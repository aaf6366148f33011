"""Fixtures for suites that run real trials through an in-process worker.

Loaded for every test by ``pytest_plugins`` in tests/conftest.py; a module that uses them
defines its own module-scoped ``settings`` fixture (a ``TrialflowSettings`` with its own task
queue, S3 prefix and worker id: ``worker_settings`` builds one).

The worker stack (temporalio, docker, trialflow.cli._worker) is imported inside the fixtures and
helpers that use it, never at import: every pytest run loads this module, and a run of the
proxy tests alone must not pay for (or depend on) the worker's imports
(tests/test_conftest_imports.py checks that).
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from trialflow.cli._worker import WorkerProcess
    from trialflow.settings import TrialflowSettings

REPO = Path(__file__).resolve().parents[1]


def worker_settings(
    name: str, temporal_address: str, s3_endpoint: Any, docker_client: Any, **overrides: Any
) -> TrialflowSettings:
    """Settings for one module's in-process worker against the session's real services: its
    own task queue, S3 prefix and worker id (all ``{name}-{random}``, so modules sharing the
    Temporal and S3 servers never see each other's trials), after the sandbox base image is
    made. ``overrides`` are further settings (model_dir, replica_urls, ...)."""
    from trialflow.sandbox.base_image import ensure_base_image
    from trialflow.settings import load_settings

    ensure_base_image(docker_client)
    unique = f"{name}-{uuid.uuid4().hex[:8]}"
    return load_settings(
        temporal_address=temporal_address,
        task_queue=unique,
        s3_endpoint=s3_endpoint.endpoint_url,
        s3_bucket=s3_endpoint.bucket,
        s3_prefix=unique,
        s3_access_key=s3_endpoint.access_key,
        s3_secret_key=s3_endpoint.secret_key,
        worker_id=unique,
        **{"drain_grace_s": 5, **overrides},
    )


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
    from trialflow import batch

    return await batch.connect(settings.temporal_address)


@pytest.fixture(scope="module")
async def worker(settings, client) -> AsyncIterator[WorkerProcess]:
    from trialflow.cli._worker import WorkerProcess

    async with WorkerProcess(settings, client) as process:
        yield process


@pytest.fixture
def no_leaked_sandboxes(docker_client, worker) -> Iterator[None]:
    """No container of THIS worker outlives a test (other sessions share the engine)."""
    yield
    mine = docker_client.containers.list(all=True, filters={"label": f"trialflow.worker={worker.host_queue}"})
    assert not mine, f"sandboxes left behind: {[c.name for c in mine]}"
