"""Where an image a task needs comes from (pure): present, pulled, a stand-in, or refused.

`ImagePolicy.offline` False (the default, a machine whose engine reaches registries): an
image not present locally is pulled with the engine's credentials, as `docker compose build`
would for Harbor. True (a machine that cannot pull, such as this repository's demo and
tests): an image not present locally gets trialflow's local stand-in where the table in
`trialflow.sandbox.base_image` has one, built under trialflow's own name (`standin_tag`:
``trialflow-standin/<ref>``) and put into the task's Dockerfile in place of the public name
at build time; a public name is never tagged. Without a stand-in it is refused.

Both the worker (`DockerImages`, when it builds) and `trialflow run` (before submitting)
decide with `resolve`, so what is refused before submit is what set-up would refuse.

An image under a name the stand-in table covers that carries trialflow's recipe label is a
stand-in an older trialflow tagged under the public name: it is treated as absent (pulled
again online, where the real image replaces it; a stand-in under trialflow's name offline).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["ImagePolicy", "Resolution", "Source", "normalize", "resolve", "standin_tag"]

STANDIN_REPO = "trialflow-standin"
# Images trialflow makes itself (base_image.ensure_base_image): never pulled, made when missing.
OWN_PREFIXES = ("trialflow-base:", "trialflow-rootfs:", f"{STANDIN_REPO}/")


@dataclass(frozen=True)
class ImagePolicy:
    """How a worker gets the images tasks name (settings `images_offline`,
    `images_build_timeout_multiplier`: Harbor's `--environment-build-timeout-multiplier`,
    applied to each task's `build_timeout_sec`, which bounds its pulls, stand-ins and build)."""

    offline: bool = False
    build_timeout_multiplier: float = 1.0


class Source(enum.Enum):
    LOCAL = "present locally"
    OWN = "made by trialflow"
    PULL = "pulled"
    STANDIN = "trialflow's local stand-in"
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Resolution:
    source: Source
    name: str  # what the build (or the sandbox) uses
    reason: str = ""  # why UNAVAILABLE, one line


_DOMAIN = re.compile(r"[.:]|^localhost$")


def normalize(ref: str) -> str:
    """The full form of an image reference: ``ubuntu`` -> ``docker.io/library/ubuntu:latest``
    (a first path part with a dot or a port, or ``localhost``, is a registry; a digest wins
    over the tag)."""
    name, at, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    first, sep, rest = name.partition("/")
    if not sep or not _DOMAIN.search(first):
        first, rest = "docker.io", name
    if first == "docker.io" and "/" not in rest:
        rest = f"library/{rest}"
    suffix = f"@{digest}" if at else f":{tag or 'latest'}"
    return f"{first}/{rest}{suffix}"


def standin_tag(ref: str) -> str:
    """trialflow's own name for the stand-in of `ref`: ``trialflow-standin/ubuntu:24.04``,
    ``trialflow-standin/ghcr.io/laude-institute/t-bench/python-3-13:20250620``."""
    full = normalize(ref).removeprefix("docker.io/").removeprefix("library/")
    return f"{STANDIN_REPO}/{full.lower()}"


def is_own(ref: str) -> bool:
    return ref.startswith(OWN_PREFIXES)


def resolve(
    ref: str, *, present: bool, has_standin: bool, policy: ImagePolicy, made_here: bool = False
) -> Resolution:
    """Where `ref` comes from, given whether the engine has it (`present`, old public-name
    stand-ins counted as absent), whether trialflow has a stand-in for it, and whether the
    worker makes it itself (`made_here`: the local bases, checked against their recipe).
    A trialflow name is never pulled: on a registry it would be someone else's image."""
    if made_here:
        return Resolution(Source.OWN, ref)
    if present:
        return Resolution(Source.LOCAL, ref)
    if is_own(ref):
        return Resolution(
            Source.UNAVAILABLE,
            ref,
            f"{ref} is not present locally and is a name trialflow gives its own images, never "
            "pulled (`python -m infra.base_image --all` makes the bases)",
        )
    if not policy.offline:
        return Resolution(Source.PULL, ref)
    if has_standin:
        return Resolution(Source.STANDIN, standin_tag(ref))
    return Resolution(
        Source.UNAVAILABLE,
        ref,
        f"{ref} is not present locally, images are not pulled (images_offline), and trialflow has "
        "no stand-in for it (docs/harbor.md lists them)",
    )
