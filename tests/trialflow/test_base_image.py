"""The base image: idempotent ensure, and the tools sandboxes rely on are inside."""

import time

import pytest

from trialflow.sandbox.base_image import (
    BASE_IMAGE,
    PACKAGES,
    ensure_base_image,
    rootfs_tarball_path,
)

pytestmark = pytest.mark.docker


def test_ensure_is_idempotent_and_fast_when_present(docker_client):
    first = ensure_base_image(docker_client)
    t0 = time.monotonic()
    assert ensure_base_image(docker_client) == first
    assert time.monotonic() - t0 < 5


def test_image_has_the_tools(docker_client):
    ensure_base_image(docker_client)
    out = docker_client.containers.run(
        BASE_IMAGE,
        ["bash", "-c", "python3 --version && tmux -V && timeout --version | head -1 && ps --version"],
        network_mode="host",
        remove=True,
    ).decode()
    assert "Python 3" in out and "tmux" in out and "coreutils" in out and "procps" in out


def test_tarball_cache_name_follows_package_list(tmp_path):
    assert rootfs_tarball_path(tmp_path).parent == tmp_path
    assert rootfs_tarball_path(tmp_path).name.startswith("bookworm-rootfs-")
    assert "python3" in PACKAGES and "tmux" in PACKAGES
