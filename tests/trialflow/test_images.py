"""Images as set-up gets them, on the real engine, offline (this machine reaches no registry;
the pulling path is tests/trialflow/test_registry.py): stand-ins under trialflow's own names
with the Dockerfile rewritten at build time (public tags never touched), different images
made at the same time and each once, and every problem of every task before submit."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid

import docker.errors
import pytest

from tests.trialflow.test_tasks import make_task
from trialflow.errors import BaseImageUnavailable, DockerfileUnsupported, ImageUnavailable
from trialflow.preflight import check_batch
from trialflow.sandbox.image_check import ImageChecker
from trialflow.sandbox.image_refs import ImagePolicy
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker


def _state(client, ref: str) -> str | None:
    try:
        return client.images.get(ref).id
    except docker.errors.ImageNotFound:
        return None


async def test_copy_from_a_public_image_gets_its_stand_in_and_no_public_name_is_tagged(
    tmp_path, sandbox_for, docker_client
):
    publics = ["ubuntu:24.04", "debian:bookworm"]
    before = {ref: _state(docker_client, ref) for ref in publics}
    dockerfile = "FROM ubuntu:24.04\nCOPY --from=debian:bookworm /etc/debian_version /from-bookworm\n"
    task = load_task(make_task(tmp_path / "cf", dockerfile=dockerfile))
    sb = await sandbox_for(task)
    res = await sb.exec("cat /from-bookworm; grep VERSION_CODENAME /etc/os-release")
    assert res.ok and res.stdout.startswith("12.") and "trixie" in res.stdout, res
    assert {ref: _state(docker_client, ref) for ref in publics} == before
    assert all(_state(docker_client, f"trialflow-standin/{ref}") for ref in publics)
    assert (task.path / "environment/Dockerfile").read_text() == dockerfile


async def test_distinct_images_are_made_at_the_same_time_and_each_once(tmp_path, make_backend, docker_client):
    """Two bases whose makers wait for each other: under one lock for all images the first
    would wait for the second forever (the barrier breaks after 30 s: BaseImageUnavailable)."""
    uid = uuid.uuid4().hex[:8]
    a, b = f"trialflow-testbase:a{uid}", f"trialflow-testbase:b{uid}"
    barrier = threading.Barrier(2, timeout=30)
    calls: list[str] = []

    def maker(name: str):
        def make(client) -> None:
            calls.append(name)
            barrier.wait()  # both makers at once, or BrokenBarrierError
            client.images.get("trialflow-base:bookworm").tag(name)

        return make

    be = make_backend(base_images={a: maker(a), b: maker(b)})
    tasks = [
        load_task(make_task(tmp_path / f"t{i}", dockerfile=f"FROM {base}\nRUN echo {i} > /n\n"))
        for i, base in enumerate([a, a, b])
    ]
    try:
        infos = await asyncio.gather(*(be.ensure_image(t) for t in tasks))
        assert sorted(calls) == sorted([a, b]) and all(i.built for i in infos)
    finally:
        for tag in [a, b, *(t.image_tag for t in tasks)]:
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(tag, force=True)


async def test_a_broken_barrier_would_show_as_a_retryable_base_failure(tmp_path, make_backend):
    """The other side of the test above: a maker that fails is BaseImageUnavailable (retried)."""
    be = make_backend(
        base_images={"trialflow-testbase:never": lambda c: threading.Barrier(2, timeout=0.1).wait()}
    )
    task = load_task(make_task(tmp_path / "n", dockerfile="FROM trialflow-testbase:never\n"))
    with pytest.raises(BaseImageUnavailable, match="BrokenBarrierError|could not make") as exc:
        await be.ensure_image(task)
    assert exc.value.retryable


async def test_set_up_refuses_what_it_cannot_build_before_building(tmp_path, make_backend):
    be = make_backend()
    buildkit = load_task(
        make_task(
            tmp_path / "bk",
            dockerfile="FROM trialflow-base:bookworm\nRUN --mount=type=cache,target=/c true\n",
        )
    )
    with pytest.raises(DockerfileUnsupported, match="line 2: RUN --mount needs BuildKit"):
        await be.ensure_image(buildkit)
    alpine = load_task(make_task(tmp_path / "al", dockerfile="FROM alpine:3.22\n"))
    with pytest.raises(ImageUnavailable, match="alpine:3.22 is not present locally.*no stand-in") as exc:
        await be.ensure_image(alpine)
    assert not exc.value.retryable
    prebuilt = load_task(
        make_task(tmp_path / "pb", '[environment]\ndocker_image = "ubuntu:24.04"\n', dockerfile=None)
    )
    info = await be.ensure_image(prebuilt)  # offline: the stand-in, under its own name
    assert info.tag == "trialflow-standin/ubuntu:24.04" and not info.built


def test_every_problem_of_every_task_is_listed_before_submit(tmp_path, docker_client):
    bad_image = make_task(
        tmp_path / "bad-image",
        dockerfile="FROM alpine:3.22\nRUN --mount=type=cache,target=/c true\nCOPY <<EOF /x\nhi\nEOF\n",
        solve_sh="true\n",
    )
    bad_fields = make_task(
        tmp_path / "bad-fields",
        '[verifier]\ntimeout_sec = "soon"\n[agent]\ntimeout_sec = "later"\n',
        solve_sh="true\n",
    )
    copy_from = make_task(
        tmp_path / "copy-from",
        dockerfile="FROM ubuntu:24.04\nCOPY --from=ghcr.io/astral-sh/uv:latest /uv /bin/uv\n",
        solve_sh="true\n",
    )
    prebuilt = make_task(
        tmp_path / "prebuilt", '[environment]\ndocker_image = "alpine:3.22"\n', dockerfile=None
    )
    good = make_task(tmp_path / "good", dockerfile="FROM python:3.12-slim\n", solve_sh="true\n")
    check = check_batch(
        [bad_image, bad_fields, copy_from, prebuilt, good],
        "oracle",
        samples=1,
        images=ImageChecker(docker_client, ImagePolicy(offline=True)),
    )
    assert check.general == []
    assert list(check.tasks) == [bad_image, bad_fields, copy_from, prebuilt]  # good is not there
    text = {path.name: "\n".join(lines) for path, lines in check.tasks.items()}
    assert len(check.tasks[bad_image]) == 3
    assert "environment/Dockerfile line 1: FROM alpine:3.22 is not present locally" in text["bad-image"]
    assert "environment/Dockerfile line 2: RUN --mount needs BuildKit" in text["bad-image"]
    assert "environment/Dockerfile line 3: COPY with a heredoc (<<) needs BuildKit" in text["bad-image"]
    assert len(check.tasks[bad_fields]) == 2  # every invalid field, not only the first
    assert (
        "task.toml:verifier.timeout_sec" in text["bad-fields"]
        and "task.toml:agent.timeout_sec" in text["bad-fields"]
    )
    assert check.tasks[copy_from] == [
        f"{copy_from}: environment/Dockerfile line 2: COPY --from ghcr.io/astral-sh/uv:latest is not present "
        "locally, images are not pulled (images_offline), and trialflow has no stand-in for it (docs/harbor.md lists them)"
    ]
    assert "docker_image alpine:3.22 is not present locally" in text["prebuilt"]
    assert "solution/solve.sh is missing" in text["prebuilt"]
    assert all("\n" not in line for line in check.problems)
