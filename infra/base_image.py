"""`python -m infra.base_image [--force]`: make `trialflow-base:bookworm` on this machine.

The builder itself lives in `trialflow.sandbox.base_image` (the Docker backend uses it);
this entry point adds what a fresh machine needs first: a running Docker engine.
"""

from __future__ import annotations

import argparse
import logging

import docker

from trialflow.sandbox.base_image import BASE_IMAGE, PACKAGES, ensure_base_image, rootfs_tarball_path

__all__ = ["BASE_IMAGE", "PACKAGES", "ensure_base_image", "main", "rootfs_tarball_path"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild rootfs and re-import")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from infra.services import ensure_dockerd  # a fresh machine has no engine running yet

    ensure_dockerd()
    print(ensure_base_image(docker.from_env(), force=args.force))


if __name__ == "__main__":
    main()
