"""Store activities on the shared queue (any worker).

`store_result`: the trial's final `TrialResult` as JSON next to its attempts, at the very end
of every trial (also failed and cancelled ones), so `trialflow inspect TRIAL` finds the result
in the store without Temporal. It also counts the result in this worker's metrics.

`fence_attempt`: the workflow declares an attempt lost with its host; the trial's fence record
refuses that attempt's later writes (trialflow.fencing). On the shared queue so that it never
waits for the lost host.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities._support import typed_errors
from trialflow.fencing import fence_attempt
from trialflow.metrics import TrialMetrics
from trialflow.storage import ResultStore, trial_fence_key, trial_result_key
from workflows.shared import FenceInput, FenceOutput, StoreResultInput, StoreResultOutput


class StoreActivities:
    def __init__(self, store: ResultStore, metrics: TrialMetrics) -> None:
        self._store = store
        self._metrics = metrics

    @activity.defn(name="trial.store_result")
    async def store_result(self, inp: StoreResultInput) -> StoreResultOutput:
        key = trial_result_key(inp.result.batch_id, inp.result.trial_id)
        # The stored result names itself (a retry computes the same URI: the same bytes).
        result = inp.result.model_copy(update={"result_uri": self._store.uri(key)})
        with typed_errors():
            uri = await asyncio.to_thread(
                self._store.put_once,  # a retried activity writes the same bytes; nothing overwrites
                key,
                result.model_dump_json(indent=2).encode(),
                "application/json",
            )
        self._metrics.trials_completed.labels(result.termination_reason).inc()
        if result.error is not None:
            self._metrics.trials_failed.labels(result.error.type).inc()
        return StoreResultOutput(result_uri=uri)

    @activity.defn(name="trial.fence_attempt")
    async def fence_attempt(self, inp: FenceInput) -> FenceOutput:
        with typed_errors():
            record = await asyncio.to_thread(
                fence_attempt,
                self._store,
                inp.batch_id,
                inp.trial_id,
                inp.attempt,
                inp.host_queue,
                inp.reason,
            )
        activity.logger.warning(
            "%s attempt %d fenced (lost on %s)", inp.trial_id, inp.attempt, inp.host_queue
        )
        return FenceOutput(
            epoch=record.epoch, fence_uri=self._store.uri(trial_fence_key(inp.batch_id, inp.trial_id))
        )
