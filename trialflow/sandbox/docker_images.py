"""Task images for the Docker backend: build once per environment hash, get the images it names.

Each task's environment/ is built once per content hash and tagged
`trialflow-task:<env_hash[:32]>` (`Task.image_tag`); a separate verifier environment's
image is built from tests/ the same way, tagged `trialflow-verifier:<hash of tests/>`
(`Task.verifier_image`). A second request for the same content is a cache hit
(`ImageInfo.built is False`). Builds use host networking (no bridge exists here).

Before building, the Dockerfile is read (`trialflow.sandbox.dockerfile`): what the engine's
builder refuses is `DockerfileUnsupported`, listed by line; every image it brings in (FROM,
COPY --from) and a task's `docker_image` is got as `trialflow.sandbox.image_refs.resolve`
says: used when present, `trialflow-base:*` made (debootstrap) when missing or outdated,
else pulled (`docker_pull.pull`: the engine's credentials, progress in `progress(tag)` and
the log) or, offline, replaced by trialflow's stand-in (`trialflow-standin/<ref>`, put into
the Dockerfile at build time; the build's own Dockerfile is never touched and a public name
never tagged), or refused (`ImageUnavailable`). Each image is got under a lock of its own, so
different images are pulled and made at the same time and one image once. A task image
built with stand-ins records them (`STANDINS_LABEL`); an online worker builds it again from
the real images.

`[environment].build_timeout_sec` (times `ImagePolicy.build_timeout_multiplier`) bounds the
pulls, stand-ins and build together (`ImageBuildTimeout`). Changing a base image does not
change task hashes: remove `trialflow-task:*` / `trialflow-verifier:*` images then.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Protocol, TypeVar

import docker
import docker.errors
import requests.exceptions
import urllib3.exceptions

from trialflow.errors import (
    BaseImageUnavailable,
    DockerfileUnsupported,
    ImageBuildFailed,
    ImageBuildTimeout,
    ImageUnavailable,
)
from trialflow.sandbox import dockerfile as dockerfile_facts
from trialflow.sandbox.base import ImageInfo
from trialflow.sandbox.base_image import RECIPE_LABEL, SUITES, ensure_base_image, ensure_standin, public_image
from trialflow.sandbox.docker_pull import pull
from trialflow.sandbox.image_refs import ImagePolicy, Source, normalize, resolve
from trialflow.sandbox.reaper import LABEL_MANAGED

if TYPE_CHECKING:
    from trialflow.tasks import TaskImage

log = logging.getLogger(__name__)

T = TypeVar("T")
BUILD_GRACE_S = 30.0  # host-side slack past the build timeout before giving up on the thread
STANDINS_LABEL = "trialflow.standins"  # JSON {public ref: stand-in} of a task image built offline

#: Makes a missing base image on the given engine (returns anything; its result is unused).
BaseImageMaker = Callable[[docker.DockerClient], object]


class BlockingRunner(Protocol):
    """Runs a blocking call off the event loop and returns its result."""

    def __call__(self, fn: Callable[[], T]) -> Awaitable[T]: ...


DEFAULT_BASE_IMAGES: dict[str, BaseImageMaker] = {
    f"trialflow-base:{suite}": partial(ensure_base_image, suite=suite) for suite in SUITES
}


def present_id(client: docker.DockerClient, ref: str) -> str | None:
    """The id of the local image `ref`, None when absent or when it is a stand-in an older
    trialflow tagged under a public name (`image_refs` module docstring) (blocking)."""
    try:
        img = client.images.get(ref)
    except docker.errors.ImageNotFound:
        return None
    if public_image(ref) is not None and RECIPE_LABEL in (img.labels or {}):
        return None
    return img.id


class DockerImages:
    """Builds and finds task images on one engine. `run` executes a blocking call off the
    event loop (the backend's thread pool). Concurrent requests for one tag build once; each
    image a Dockerfile names is got under its own lock (`_provide`)."""

    def __init__(
        self,
        client: docker.DockerClient,
        run: BlockingRunner,
        base_images: Mapping[str, BaseImageMaker] | None = None,
        policy: ImagePolicy | None = None,
    ) -> None:
        self.client = client
        self.policy = policy or ImagePolicy()
        self._run = run
        self._build_locks: dict[str, asyncio.Lock] = {}
        self._ref_locks: dict[str, asyncio.Lock] = {}
        self._base_images = dict(DEFAULT_BASE_IMAGES if base_images is None else base_images)
        self._ready: dict[str, str] = {}  # normalized ref -> name, made or checked by this process
        self._progress: dict[str, str] = {}  # task image tag -> what its set-up is doing now

    def progress(self, tag: str) -> str | None:
        """What getting the image `tag` is doing now (a pull's layers and bytes), or None."""
        return self._progress.get(tag)

    async def ensure(self, image: TaskImage) -> ImageInfo:
        """Get a task's image (`Task.image`, or its separate verifier's `Task.verifier_image`):
        the cached build, its `docker_image`, or a build after getting what it names."""
        tag = image.tag
        timeout = image.build_timeout_sec * self.policy.build_timeout_multiplier
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(timeout + BUILD_GRACE_S):
                async with self._build_locks.setdefault(tag, asyncio.Lock()):
                    return await self._ensure(image, t0, t0 + timeout)
        except TimeoutError:
            raise ImageBuildTimeout(
                f"{image.label}: image set-up exceeded {timeout:.0f}s ({self._progress.get(tag) or 'building'})"
            ) from None
        finally:
            self._progress.pop(tag, None)

    async def _ensure(self, image: TaskImage, t0: float, deadline: float) -> ImageInfo:
        tag = image.tag

        def say(line: str) -> None:
            self._progress[tag] = line

        if image.docker_image or image.dockerfile is None:
            ref = image.docker_image or tag
            name = await self._provide(ref, image.label, deadline, say)
            found = await self._run(lambda: self.image_id(name))
            if not found:
                raise ImageUnavailable(f"{image.label}: image {name} (docker_image) vanished")
            return ImageInfo(name, found, built=False, duration_s=time.monotonic() - t0)
        found = await self._run(lambda: self._cached(tag))
        if found:
            return ImageInfo(tag, found, built=False, duration_s=time.monotonic() - t0)
        text = await asyncio.to_thread(image.dockerfile.read_text, errors="replace")
        facts = dockerfile_facts.parse(text, image.build_args)
        if facts.problems:
            raise DockerfileUnsupported(image.label, list(facts.problems))
        refs = facts.refs
        got = await asyncio.gather(
            *(self._provide(r, image.label, deadline, say) for r in refs), return_exceptions=True
        )
        for outcome in got:  # every one awaited; the first failure is the task's
            if isinstance(outcome, BaseException):
                raise outcome
        standins = {r: n for r, n in zip(refs, got, strict=True) if isinstance(n, str) and n != r}
        say("building")
        remaining = max(1.0, deadline - time.monotonic())
        tail = await self._run(
            lambda: self._build_blocking(
                image, remaining, dockerfile_facts.rewrite(text, standins, image.build_args), standins
            )
        )
        image_id = await self._run(lambda: self.image_id(tag))
        if not image_id:
            raise ImageBuildFailed(f"{image.label}: build finished but {tag} is missing", tail)
        duration = time.monotonic() - t0
        log.info("built %s for %s in %.1fs", tag, image.label, duration)
        return ImageInfo(tag, image_id, built=True, duration_s=duration, log_tail=tail)

    def _cached(self, tag: str) -> str | None:
        """The task image's id, unless absent or built from stand-ins while this worker pulls."""
        try:
            img = self.client.images.get(tag)
        except docker.errors.ImageNotFound:
            return None
        if not self.policy.offline and STANDINS_LABEL in (img.labels or {}):
            log.info("%s was built from stand-ins; building it again from the real images", tag)
            return None
        return img.id

    async def _provide(self, ref: str, label: str, deadline: float, say: Callable[[str], None]) -> str:
        """Get the image `ref` a task names; return the name its build uses (`ref`, or the
        stand-in's). Once per image at a time (a lock per normalized reference)."""
        key = normalize(ref)
        async with self._ref_locks.setdefault(key, asyncio.Lock()):
            if key in self._ready:
                return self._ready[key]
            maker = self._base_images.get(ref)
            present = maker is None and bool(await self._run(lambda: present_id(self.client, ref)))
            spec = public_image(ref)
            res = resolve(
                ref,
                present=present,
                has_standin=spec is not None,
                policy=self.policy,
                made_here=maker is not None,
            )
            if res.source is Source.UNAVAILABLE:
                raise ImageUnavailable(f"{label}: {res.reason}")
            if res.source is Source.PULL:
                await self._run(
                    lambda: pull(self.client, ref, deadline=deadline, label=label, on_progress=say)
                )
                return ref
            if res.source is Source.LOCAL:
                return ref
            if res.source is Source.OWN:
                assert maker is not None
                await self._make(ref, partial(maker, self.client), say)
            else:  # a stand-in: its base under the base's own lock first, so it is made once
                assert spec is not None
                await self._provide(f"trialflow-base:{spec.suite}", label, deadline, say)
                await self._make(res.name, partial(ensure_standin, self.client, ref), say)
            self._ready[key] = res.name
            return res.name

    async def _make(self, name: str, make: Callable[[], object], say: Callable[[str], None]) -> None:
        say(f"making {name}")
        try:  # cheap when present: the recipe label is compared
            await self._run(make)
        except Exception as e:  # debootstrap/mirror trouble: worth another attempt
            raise BaseImageUnavailable(f"could not make base image {name}: {e}") from e

    def image_id(self, tag: str) -> str | None:
        """The local image's id, None when absent (blocking)."""
        try:
            return self.client.images.get(tag).id
        except docker.errors.ImageNotFound:
            return None

    def _build_blocking(self, image: TaskImage, timeout: float, text: str, standins: dict[str, str]) -> str:
        """`docker build` of the context; with stand-ins, of the rewritten Dockerfile `text`
        (a file outside the context, which the SDK adds to the context it sends)."""
        labels = {LABEL_MANAGED: "true", "trialflow.env_hash": image.content_hash}
        if not standins:
            own = image.dockerfile  # a compose service's may have another name or place
            named = own is not None and own != image.context_dir / "Dockerfile"
            return self._build_stream(image, timeout, str(own) if named else None, labels)
        labels[STANDINS_LABEL] = json.dumps(standins, sort_keys=True)
        fd, path = tempfile.mkstemp(prefix="trialflow-dockerfile-")
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            return self._build_stream(image, timeout, path, labels)
        finally:
            os.unlink(path)

    def _build_stream(
        self, image: TaskImage, timeout: float, dockerfile: str | None, labels: dict[str, str]
    ) -> str:
        lines: deque[str] = deque(maxlen=60)
        t0 = time.monotonic()
        try:
            # pull=False: what the Dockerfile names was got before (_provide); the engine
            # would otherwise ask the registry again at every build.
            stream = self.client.api.build(
                path=str(image.context_dir),
                dockerfile=dockerfile,
                tag=image.tag,
                network_mode="host",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                timeout=timeout,
                labels=labels,
                buildargs=image.build_args or None,  # a compose service's build args and target
                target=image.target,
            )
            for chunk in stream:
                if "stream" in chunk:
                    lines.extend(chunk["stream"].rstrip("\n").splitlines())
                if "error" in chunk:
                    lines.append(chunk["error"])
                    raise ImageBuildFailed(
                        f"{image.label}: docker build failed: {chunk['error'].strip()}", "\n".join(lines)
                    )
                if time.monotonic() - t0 > timeout:
                    stream.close()  # closing the connection makes the engine cancel the build
                    raise ImageBuildTimeout(
                        f"{image.label}: image build exceeded {timeout:.0f}s", "\n".join(lines)
                    )
        # A silent build step hits the HTTP read timeout: from urllib3 directly while streaming.
        except (requests.exceptions.ReadTimeout, urllib3.exceptions.ReadTimeoutError):
            raise ImageBuildTimeout(
                f"{image.label}: image build exceeded {timeout:.0f}s", "\n".join(lines)
            ) from None
        except docker.errors.APIError as e:
            raise ImageBuildFailed(f"{image.label}: docker build rejected: {e}", "\n".join(lines)) from e
        return "\n".join(lines)
