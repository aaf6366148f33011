"""verl test fixtures: a real local Ray instance (verl's load balancer and agent-loop
workers are Ray actors; 4 logical CPUs: the balancer, one AgentLoopWorker, and
TransferQueue's controller and storage unit when a test uses verl's v1 worker)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def transfer_queue(ray_local):
    """A real TransferQueue (PyPI ``transferqueue``, what verl's v1 trainer imports as
    ``transfer_queue``): its controller and one in-memory storage unit on the local Ray."""
    import transfer_queue as tq
    from omegaconf import OmegaConf

    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    yield tq
    tq.close()
