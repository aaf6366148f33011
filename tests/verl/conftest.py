"""verl test fixtures: a real local Ray instance (verl's load balancer and agent-loop
workers are Ray actors; 2 CPUs: the balancer and one AgentLoopWorker)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
