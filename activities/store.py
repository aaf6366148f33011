"""Result storage activity: the trial's final `TrialResult` as JSON next to its attempts.

Runs on the shared queue at the very end of every trial (also failed and cancelled ones),
so `trialflow inspect TRIAL` finds the result in the store without Temporal. It also
counts the result in this worker's metrics.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities._support import typed_errors
from trialflow.metrics import TrialMetrics
from trialflow.storage import ResultStore, trial_result_key
from workflows.shared import StoreResultInput, StoreResultOutput


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
