"""Build the local sandbox base image `trialflow-base:bookworm` without pulling anything.

No registry is reachable here, so the image is made from a Debian root filesystem:
`debootstrap --variant=minbase --include=<PACKAGES> bookworm ROOTFS`, packed as a
tarball, then `docker import`ed. Task Dockerfiles say `FROM trialflow-base:bookworm`.

Idempotent at two levels:
- the image: `ensure_base_image(client)` returns at once when the tag exists;
- the rootfs tarball: cached at `.cache/base-image/bookworm-rootfs.tar` (repository
  root), so a fresh Docker engine re-imports in seconds instead of re-running debootstrap.
  The cache name carries a hash of the package list: changing PACKAGES rebuilds it.

Usage: `python -m infra.base_image [--force]` (starts the Docker engine first when none
answers) or `ensure_base_image(docker.from_env())`; `DockerBackend` calls it for a task whose
Dockerfile says `FROM trialflow-base:bookworm` when that image is missing.

Edge cases: debootstrap needs root and a reachable Debian mirror; a failure raises
`BaseImageError` with the tail of its output. A partial tarball is never left
under the final name (written to `*.tmp`, then renamed).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import docker

log = logging.getLogger(__name__)

BASE_IMAGE = "trialflow-base:bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What agents and sample tasks expect to find: a shell, Python for tests, tmux for
# terminal-style agents, ps/kill for timeouts, and the usual file tools.
PACKAGES = (
    "bash",
    "coreutils",
    "findutils",
    "grep",
    "sed",
    "gawk",
    "diffutils",
    "patch",
    "procps",
    "psmisc",
    "tmux",
    "python3",
    "ca-certificates",
    "less",
    "file",
    "git",
    "curl",
    "xz-utils",
)
REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = REPO_ROOT / ".cache" / "base-image"


class BaseImageError(RuntimeError):
    """debootstrap or `docker import` failed; the message carries the output tail."""


def _packages_digest() -> str:
    return hashlib.sha256(" ".join(sorted(PACKAGES)).encode()).hexdigest()[:12]


def rootfs_tarball_path(cache_dir: Path = CACHE_DIR) -> Path:
    return cache_dir / f"{SUITE}-rootfs-{_packages_digest()}.tar"


def _run(argv: list[str], what: str, timeout_s: float) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise BaseImageError(f"{what} failed with exit code {proc.returncode}:\n{tail}")


def _unmount_below(root: Path) -> None:
    prefix = str(root.resolve()) + "/"
    with open("/proc/mounts") as fh:
        targets = [line.split()[1] for line in fh if line.split()[1].startswith(prefix)]
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


def build_rootfs_tarball(dest: Path, timeout_s: float = 1200) -> Path:
    """Run debootstrap into a temporary dir and tar it to `dest` (atomic rename)."""
    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap is not installed (infra/setup.sh installs it)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trialflow-rootfs-", dir=dest.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        try:
            _run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--include={','.join(PACKAGES)}",
                    SUITE,
                    str(rootfs),
                    MIRROR,
                ],
                "debootstrap",
                timeout_s,
            )
        finally:
            # A failed debootstrap leaves /proc and /sys mounted inside the rootfs; the
            # temporary-dir cleanup must never recurse into them.
            _unmount_below(rootfs)
        # Downloaded .debs are dead weight in every sandbox image.
        for deb in (rootfs / "var/cache/apt/archives").glob("*.deb"):
            deb.unlink()
        partial = dest.with_suffix(".tar.tmp")
        _run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], "tar", timeout_s)
        os.replace(partial, dest)
    return dest


def image_exists(client: docker.DockerClient, tag: str = BASE_IMAGE) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def ensure_base_image(
    client: docker.DockerClient, *, force: bool = False, cache_dir: Path = CACHE_DIR
) -> str:
    """Make sure `trialflow-base:bookworm` exists; return its image id.

    `force=True` rebuilds the rootfs tarball and re-imports even when both exist.
    """
    if not force and image_exists(client):
        return client.images.get(BASE_IMAGE).id
    tarball = rootfs_tarball_path(cache_dir)
    if force or not tarball.exists():
        t0 = time.monotonic()
        log.info("debootstrap %s -> %s", SUITE, tarball)
        build_rootfs_tarball(tarball)
        log.info("rootfs built in %.1fs", time.monotonic() - t0)
    t0 = time.monotonic()
    repo, tag = BASE_IMAGE.split(":")
    # From a file path the SDK sends a Content-Length body; its chunked stream upload is
    # rejected by this engine ("invalid byte in chunk length").
    out = client.api.import_image_from_file(
        str(tarball),
        repository=repo,
        tag=tag,
        changes=[
            'CMD ["/bin/bash"]',
            "ENV LANG=C.UTF-8",
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ],
    )
    if not image_exists(client):
        raise BaseImageError(f"docker import did not produce {BASE_IMAGE}: {out!r}"[:2000])
    log.info("imported %s in %.1fs", BASE_IMAGE, time.monotonic() - t0)
    return client.images.get(BASE_IMAGE).id
