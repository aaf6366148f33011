"""`python -m infra.base_image [--all] [--force]`: make the local base images on this machine.

Default: `trialflow-base:bookworm`. `--all`: also `trialflow-base:trixie` and the Harbor
reference image (`trialflow-harbor-ref:0.25`, PyPI harbor in a trixie venv) that the
harbor_ref tests use, and the OpenHands root (trixie + the OpenHands SDK venv, unpacked
at `.cache/openhands/root` for the `openhands` scaffold); `infra/setup.sh` runs `--all` so CI
builds each once.

The builders live in `trialflow.sandbox.base_image` (the Docker backend uses them); this
entry point adds what a fresh machine needs first: a running Docker engine.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time
from collections.abc import Callable

import docker

from trialflow.sandbox.base_image import (
    BASE_IMAGE,
    HARBOR_REF_IMAGE,
    PACKAGES,
    SUITES,
    ensure_base_image,
    ensure_harbor_ref_image,
    ensure_openhands_root,
    rootfs_tarball_path,
)

__all__ = ["BASE_IMAGE", "PACKAGES", "ensure_base_image", "main", "rootfs_tarball_path"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild rootfs and re-import")
    parser.add_argument("--all", action="store_true", help="both suites and the Harbor reference image")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from infra.services import ensure_dockerd  # a fresh machine has no engine running yet

    ensure_dockerd()
    client = docker.from_env()
    started = time.monotonic()

    def step(name: str, make: Callable[[], object], fresh: str) -> None:
        """One line before a step (a fresh build takes `fresh`), one with its result after."""
        print(f"  {name}: checking (a fresh build takes {fresh}; cached: seconds)", flush=True)
        result = make()
        print(f"  {name}: {result} (+{time.monotonic() - started:.0f} s)", flush=True)

    for suite in SUITES if args.all else ("bookworm",):
        step(
            f"trialflow-base:{suite}",
            functools.partial(ensure_base_image, client, force=args.force, suite=suite),
            "about a minute",
        )
    if args.all:
        step(HARBOR_REF_IMAGE, lambda: ensure_harbor_ref_image(client), "a few minutes")
        step("openhands root", lambda: ensure_openhands_root(client), "about 6 minutes")


if __name__ == "__main__":
    main()
