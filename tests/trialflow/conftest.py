"""Fixtures for trialflow's sandbox/verifier/scaffold tests (real Docker engine).

base_image      ensures `trialflow-base:bookworm` exists (debootstrap on first use)
make_backend    factory of DockerBackends (offline images unless `images=` says otherwise),
                each with a label unique to it, so its `reap()`
                never touches containers of other sessions; at teardown it fails the test
                if any container of those labels is left behind (scoped, unlike the global
                `no_leaked_containers`, which other sessions sharing the engine can trip)
backend         `make_backend()`
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
    from trialflow.sandbox.base_image import ensure_base_image

    return ensure_base_image(docker_client)


@pytest.fixture
def make_backend(docker_client, base_image) -> Iterator:
    from trialflow.sandbox import DockerBackend
    from trialflow.sandbox.image_refs import ImagePolicy

    made: list[DockerBackend] = []

    def make(**kwargs) -> DockerBackend:
        kwargs.setdefault("images", ImagePolicy(offline=True))  # no registry here: stand-ins
        be = DockerBackend(docker_client, labels={"trialflow.test_run": uuid.uuid4().hex}, **kwargs)
        made.append(be)
        return be

    yield make
    leaked = []
    for be in made:
        scope = [f"{k}={v}" for k, v in be.labels.items()]
        for c in docker_client.containers.list(all=True, filters={"label": scope}):
            leaked.append(c.name)
            c.remove(force=True)
        be.close()
    assert not leaked, f"containers left behind: {leaked}"


@pytest.fixture
def backend(make_backend):
    return make_backend()


@pytest.fixture
async def sandbox_for(backend) -> AsyncIterator:
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
