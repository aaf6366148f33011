"""Where an image comes from (pure): the decision both set-up and the pre-submit checks make."""

from __future__ import annotations

import pytest

from trialflow.sandbox.image_refs import ImagePolicy, Source, normalize, resolve, standin_tag

ONLINE, OFFLINE = ImagePolicy(), ImagePolicy(offline=True)


@pytest.mark.parametrize(
    ("ref", "full"),
    [
        ("ubuntu", "docker.io/library/ubuntu:latest"),
        ("ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
        ("docker.io/library/ubuntu:24.04", "docker.io/library/ubuntu:24.04"),
        ("me/app:1", "docker.io/me/app:1"),
        ("ghcr.io/astral-sh/uv:latest", "ghcr.io/astral-sh/uv:latest"),
        ("127.0.0.1:5000/x/y", "127.0.0.1:5000/x/y:latest"),
        ("localhost/y:2", "localhost/y:2"),
        ("python:3.12@sha256:abc", "docker.io/library/python@sha256:abc"),
    ],
)
def test_normalize(ref, full):
    assert normalize(ref) == full


def test_standin_names_are_trialflows_own():
    assert standin_tag("ubuntu:24.04") == "trialflow-standin/ubuntu:24.04"
    assert standin_tag("docker.io/library/python:3.13-slim") == "trialflow-standin/python:3.13-slim"
    assert (
        standin_tag("ghcr.io/laude-institute/t-bench/python-3-13:20250620")
        == "trialflow-standin/ghcr.io/laude-institute/t-bench/python-3-13:20250620"
    )


def test_resolution_table():
    def source(ref, present=False, standin=False, policy=ONLINE, made=False):
        return resolve(ref, present=present, has_standin=standin, policy=policy, made_here=made).source

    assert source("ubuntu:24.04", present=True, standin=True, policy=OFFLINE) is Source.LOCAL
    assert source("ubuntu:24.04", standin=True) is Source.PULL  # online: the real image, never a stand-in
    assert source("ubuntu:24.04", standin=True, policy=OFFLINE) is Source.STANDIN
    assert source("alpine:3.22", policy=OFFLINE) is Source.UNAVAILABLE
    assert source("trialflow-base:trixie", made=True, policy=OFFLINE) is Source.OWN
    # a trialflow name is never pulled (on a registry it would be someone else's image)
    assert source("trialflow-standin/ubuntu:24.04") is Source.UNAVAILABLE
    res = resolve("ubuntu:24.04", present=False, has_standin=True, policy=OFFLINE)
    assert res.name == "trialflow-standin/ubuntu:24.04"
    refused = resolve("alpine:3.22", present=False, has_standin=False, policy=OFFLINE)
    assert "alpine:3.22 is not present locally" in refused.reason and "no stand-in" in refused.reason
