"""verl's weight sync, told to every trialflow worker's proxy.

`TemporalCheckpointEngineManager` is verl's own ``CheckpointEngineManager`` (select it with
``actor_rollout_ref.rollout.checkpoint_manager_class=trialflow.verl.weight_sync.TemporalCheckpointEngineManager``).
After verl's ``update_weights(global_steps)`` has put the new weights on the rollout
replicas, it broadcasts ``POST /policy_version {"version": global_steps}`` to every worker
proxy registered in the store (`trialflow.policy_sync`), so sessions record from then on that
their tokens come from the new weights, and a turn running across the update records both
versions. The store comes from `TrialflowSettings` (``TRIALFLOW_*`` environment: verl builds
this manager from its own config only). A sync without ``global_steps`` (verl's initial sync)
is not broadcast: there is no version to record.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.checkpoint_engine import CheckpointEngineManager
from verl.utils.ray_utils import auto_await

from trialflow.policy_sync import broadcast_policy_version
from trialflow.settings import load_settings
from trialflow.storage import ResultStore, open_store

log = logging.getLogger(__name__)


class TemporalCheckpointEngineManager(CheckpointEngineManager):
    """verl's manager plus the broadcast (module docstring). ``store``: for tests; else the
    settings' store, opened on first use."""

    store: ResultStore | None = None

    @auto_await
    async def update_weights(self, global_steps: int | None = None) -> Any:
        result = await super().update_weights(global_steps=global_steps)
        if global_steps is not None:
            if self.store is None:
                self.store = open_store(load_settings())
            delivered = await broadcast_policy_version(self.store, int(global_steps))
            log.info(
                "policy version %s sent to %d worker proxies: %s", global_steps, len(delivered), delivered
            )
        return result
