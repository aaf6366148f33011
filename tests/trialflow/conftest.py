"""Fixtures for trialflow's sandbox/verifier/scaffold tests (real Docker engine).

    base_image      ensures `trialflow-base:bookworm` exists (debootstrap on first use)
    backend         a DockerBackend whose containers carry a label unique to this test,
                    so its `reap()` can never touch containers of other sessions
    sandbox_for     async factory: `await sandbox_for(task)` -> started sandbox, stopped at teardown
    fixture_task    path of a task under tests/trialflow/fixtures/tasks
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from trialflow.tasks import Task

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "tasks"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tasks"
SAMPLE_TASKS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "task.toml").exists())


@pytest.fixture(scope="session")
def base_image(docker_client) -> str:
    from infra.base_image import ensure_base_image

    return ensure_base_image(docker_client)


@pytest.fixture
def backend(docker_client, base_image) -> Iterator:
    from trialflow.sandbox import DockerBackend

    be = DockerBackend(docker_client, labels={"trialflow.test_run": uuid.uuid4().hex})
    yield be
    be.close()


@pytest.fixture
async def sandbox_for(backend, no_leaked_containers) -> AsyncIterator:
    made = []

    async def make(task: Task, **kwargs):
        sb = await backend.create(task, trial_id=f"test-{task.name}", **kwargs)
        made.append(sb)
        await sb.start()
        return sb

    yield make
    for sb in made:
        await sb.stop()


def fixture_task(name: str) -> Path:
    return FIXTURES / name
