"""verl_replica_urls against verl's REAL load balancer actor on a local Ray instance."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from trialflow.verl.agent_loop import ReplicaDiscoveryError, verl_replica_urls


async def test_addresses_follow_verls_load_balancer(ray_local):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    balancer = get_router_handle(servers={"10.0.0.1:8000": None, "[fd00::1]:8001": None})
    client = LLMServerClient(config=OmegaConf.create({}), load_balancer_handle=balancer)
    assert sorted(await verl_replica_urls(client)) == ["http://10.0.0.1:8000", "http://[fd00::1]:8001"]
    # verl scales replicas at runtime: the next sample sees the new set
    await balancer.add_servers.remote({"10.0.0.2:8000": None})
    await balancer.remove_servers.remote(["10.0.0.1:8000"])
    assert sorted(await verl_replica_urls(client)) == ["http://10.0.0.2:8000", "http://[fd00::1]:8001"]
    await balancer.remove_servers.remote(["10.0.0.2:8000", "[fd00::1]:8001"])
    with pytest.raises(ReplicaDiscoveryError, match="no rollout servers"):
        await verl_replica_urls(client)


async def test_a_server_manager_without_balancer_is_a_typed_error():
    with pytest.raises(ReplicaDiscoveryError):
        await verl_replica_urls(object())
