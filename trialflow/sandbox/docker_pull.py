"""Pulling an image through the engine, with the engine's clients' credentials and progress.

Credentials: the docker SDK sends the registry's entry from the Docker client configuration
(`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`: what `docker login` writes,
credential helpers included), as the docker CLI and compose do. Nothing of trialflow's own.

`pull(client, ref, deadline, on_progress)` (blocking) streams the engine's progress messages,
folds them into one line (`PullProgress.line`: layers done of known, bytes) handed to
`on_progress` at most once a second, and stops at `deadline` (closing the stream makes the
engine cancel the pull). Errors, each typed with its retry rule:

- the registry says the image does not exist or may not be read (404, "manifest unknown",
  "pull access denied", "unauthorized", "denied"): `ImageUnavailable`, never retried;
- anything else (no route, DNS, a reset stream, 5xx): `ImagePullFailed`, retried;
- past the deadline: `ImageBuildTimeout` (the task's build timeout covers its pulls).

`registry_problem(client, ref)` asks the registry about `ref` without pulling (the engine's
distribution inspect) for the checks before submit: None when it is there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import docker
import docker.errors
import requests.exceptions

from trialflow.errors import ImageBuildTimeout, ImagePullFailed, ImageUnavailable

log = logging.getLogger(__name__)

# What the engine relays when the registry answered and refused (seen with distribution 2.8:
# "manifest unknown", "no basic auth credentials"; Docker Hub: "pull access denied").
_REFUSED = (
    "manifest unknown",
    "not found",
    "pull access denied",
    "unauthorized",
    "denied",
    "does not exist",
    "no basic auth credentials",
    "authentication required",
)
LOGIN_HINT = "credentials: `docker login REGISTRY` (the engine's clients read ~/.docker/config.json)"
OFFLINE_HINT = "on a machine that cannot pull, TRIALFLOW_IMAGES_OFFLINE=1 uses trialflow's local stand-ins"


def split_ref(ref: str) -> tuple[str, str | None]:
    """(repository, tag or digest) as the engine's create-image call takes them."""
    name, at, digest = ref.partition("@")
    if at:
        return name, digest
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon > slash:
        return name[:colon], name[colon + 1 :]
    return name, "latest"


def refused(status: int | None, message: str) -> bool:
    """The registry's answer means the image is not there for us (not worth a retry)."""
    text = message.lower()
    return status in (401, 403, 404) or any(word in text for word in _REFUSED)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())[:400]


@dataclass
class PullProgress:
    """The engine's per-layer status messages folded into one line (a pure fold)."""

    ref: str
    layers: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # id -> (status, current, total)

    def add(self, chunk: dict) -> None:
        layer = chunk.get("id")
        status = chunk.get("status", "")
        if not layer or layer == self.ref.rpartition(":")[2]:
            return
        detail = chunk.get("progressDetail") or {}
        _, current, total = self.layers.get(layer, ("", 0, 0))
        if status in ("Pull complete", "Already exists"):
            current = total = max(total, current)
        elif detail.get("total"):
            current, total = int(detail.get("current", 0)), int(detail["total"])
        self.layers[layer] = (status, current, total)

    @property
    def line(self) -> str:
        done = sum(1 for s, _, _ in self.layers.values() if s in ("Pull complete", "Already exists"))
        current = sum(c for _, c, _ in self.layers.values()) / 1e6
        total = sum(t for _, _, t in self.layers.values()) / 1e6
        return f"pulling {self.ref}: {done}/{len(self.layers)} layers, {current:.1f}/{total:.1f} MB"


def pull(
    client: docker.DockerClient,
    ref: str,
    *,
    deadline: float,
    label: str,
    on_progress: Callable[[str], None] = lambda line: None,
) -> str:
    """Pull `ref` (blocking) before `deadline` (time.monotonic()); return its image id."""
    repository, tag = split_ref(ref)
    progress = PullProgress(ref)
    t0 = last = time.monotonic()
    on_progress(f"pulling {ref}")
    try:
        stream = client.api.pull(repository, tag=tag, stream=True, decode=True)
        for chunk in stream:
            if "error" in chunk:
                message = _one_line(chunk.get("error", ""))
                if refused(None, message):
                    raise ImageUnavailable(f"{label}: pulling {ref} was refused: {message} ({LOGIN_HINT})")
                raise ImagePullFailed(f"{label}: pulling {ref} failed: {message}")
            progress.add(chunk)
            now = time.monotonic()
            if now > deadline:
                stream.close()  # the engine cancels a pull whose client went away
                raise ImageBuildTimeout(f"{label}: image set-up ran out of time while {progress.line}")
            if now - last >= 1.0:
                last = now
                on_progress(progress.line)
                log.info("%s: %s", label, progress.line)
    except docker.errors.APIError as e:
        message = _one_line(e.explanation or e)
        if refused(e.status_code, message):
            raise ImageUnavailable(f"{label}: pulling {ref} was refused: {message} ({LOGIN_HINT})") from None
        raise ImagePullFailed(f"{label}: pulling {ref} failed: {message} ({OFFLINE_HINT})") from None
    except requests.exceptions.RequestException as e:
        raise ImagePullFailed(f"{label}: pulling {ref} failed: {_one_line(e)}") from None
    try:
        image_id = client.images.get(ref).id
    except docker.errors.ImageNotFound:
        raise ImagePullFailed(f"{label}: pulling {ref} finished but the image is not there") from None
    log.info("%s: pulled %s in %.1fs", label, ref, time.monotonic() - t0)
    on_progress(f"pulled {ref}")
    return image_id


def registry_problem(client: docker.DockerClient, ref: str) -> str | None:
    """Why `ref` could not be pulled, asked of its registry without pulling; None when it is there."""
    try:
        client.api.inspect_distribution(ref)
    except docker.errors.APIError as e:
        message = _one_line(e.explanation or e)
        if refused(e.status_code, message):
            return f"{ref}: the registry refuses it: {message} ({LOGIN_HINT})"
        return f"{ref}: its registry cannot be reached: {message} ({OFFLINE_HINT})"
    except requests.exceptions.RequestException as e:
        return f"{ref}: its registry cannot be reached: {_one_line(e)}"
    return None
