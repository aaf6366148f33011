"""A trainer-side process that awaits one step: `python -m tests.verl._step_client` with a
JSON request on stdin ({"settings": {...}, "specs": [...], "task_queue": str}); prints one
JSON line per trial (spec order) when the step is done. Used by the restart test, which
kills it mid-step and starts it again."""

from __future__ import annotations

import asyncio
import json
import sys

from trialflow import batch
from trialflow.settings import load_settings
from trialflow.storage import open_store
from trialflow.verl.step_batch import run_step
from workflows.shared import TrialSpec


async def main() -> None:
    req = json.loads(sys.stdin.read())
    settings = load_settings(**req["settings"])
    client = await batch.connect(settings.temporal_address)
    specs = [TrialSpec.model_validate(s) for s in req["specs"]]
    print("submitting", flush=True, file=sys.stderr)
    step = await run_step(client, open_store(settings), specs, task_queue=req["task_queue"])
    for t in step.trials:
        print(
            json.dumps(
                {
                    "trial_id": t.result.trial_id,
                    "termination": t.result.termination_reason,
                    "reward": t.result.reward,
                    "cancelled": t.cancelled,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    asyncio.run(main())
