"""Set-up of a batch whose tasks need different offline stand-ins: the images made one after
another (what the single lock over all base images did) vs at the same time (a lock per
image, `DockerImages._provide`), in the same run; and how long `trialflow run`'s checks take
to refuse a batch with an image that cannot be had (it was refused after 825 s of set-up).

    PYTHONPATH=. .venv/bin/python bench/image_setup.py --images 3

Each image is a local base made the way a python stand-in is (apt-get install of pip and
venv into the trixie base, from the Debian mirror), with a line of its own so the engine's
build cache cannot serve it (identical stand-in recipes would be cache hits after the first
machine-wide, which measures nothing), through the same path as a stand-in: a base maker
under `_provide`'s lock for that image. Names are made up for the run
(`trialflow-bench:<id>-<n>`), so nothing another user of the engine has is touched; what the
run made is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import docker
import docker.errors

from trialflow.preflight import check_batch
from trialflow.sandbox import DockerBackend
from trialflow.sandbox.image_check import ImageChecker
from trialflow.sandbox.image_refs import ImagePolicy
from trialflow.tasks import Task, load_task

OFFLINE = ImagePolicy(offline=True)


def _task(root: Path, dockerfile: str) -> Path:
    for rel, text in {
        "task.toml": 'version = "1.0"\n',
        "instruction.md": "Do it.\n",
        "environment/Dockerfile": dockerfile,
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "true\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


async def _round(backend: DockerBackend, tasks: list[Task], together: bool) -> float:
    t0 = time.monotonic()
    if together:
        await asyncio.gather(*(backend.ensure_image(t) for t in tasks))
    else:
        for t in tasks:
            await backend.ensure_image(t)
    return time.monotonic() - t0


def _maker(name: str, salt: str):
    dockerfile = (
        f"FROM trialflow-base:trixie\nRUN echo {salt} && apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq python3-pip python3-venv >/dev/null && rm -rf /var/lib/apt/lists/*\n"
    ).encode()

    def make(client: docker.DockerClient) -> None:
        client.images.build(fileobj=io.BytesIO(dockerfile), tag=name, network_mode="host", rm=True)

    return make


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=3, help="distinct images per round")
    parser.add_argument("--tasks", type=int, default=21, help="tasks in the batch the checks refuse")
    args = parser.parse_args()
    client = docker.from_env()
    run = uuid.uuid4().hex[:8]
    tmp = Path(tempfile.mkdtemp(prefix="bench-images-"))
    names = {
        mode: [f"trialflow-bench:{run}-{mode[:3]}{i}" for i in range(args.images)] for mode in ("one", "all")
    }
    made = [n for ns in names.values() for n in ns]
    makers = {n: _maker(n, f"{run}-{n}") for n in made}
    backend = DockerBackend(
        client, labels={"trialflow.bench": "image_setup"}, base_images=makers, images=OFFLINE
    )
    try:
        times = {}
        for mode, label in (("one", "one after another"), ("all", "at the same time")):
            tasks = [load_task(_task(tmp / f"{mode}{i}", f"FROM {n}\n")) for i, n in enumerate(names[mode])]
            made += [t.image_tag for t in tasks]
            times[mode] = await _round(backend, tasks, together=mode == "all")
            print(f"{args.images} images made, {label}: {times[mode]:.1f} s", file=sys.stderr, flush=True)

        good = [_task(tmp / f"ok-{i}", "FROM ubuntu:24.04\n") for i in range(args.tasks - 1)]
        bad = _task(tmp / "needs-alpine", "FROM alpine:3.22\n")
        t0 = time.monotonic()
        check = check_batch([*good, bad], "oracle", samples=1, images=ImageChecker(client, OFFLINE))
        elapsed = time.monotonic() - t0
        assert list(check.tasks) == [bad], check.problems
        report = {
            "images": args.images,
            "one_after_another_s": round(times["one"], 1),
            "at_the_same_time_s": round(times["all"], 1),
            "ratio": round(times["all"] / times["one"], 2),
            "presubmit_check_s": round(elapsed, 3),
            "presubmit_tasks": args.tasks,
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
        print(json.dumps(report))
    finally:
        backend.close()
        for name in made:
            with contextlib.suppress(docker.errors.ImageNotFound):
                client.images.remove(name, force=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
