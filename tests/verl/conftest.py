"""verl test fixtures: a real local Ray instance (verl's load balancer is a Ray actor)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
