"""trialflow for verl: the agent loop, step batches, and the pure trajectory conversion.

`convert` and `step_batch` import no verl (the evaluation CLI and plain training drivers
use them without it); the agent-loop names load verl on first access.
"""

from __future__ import annotations

from typing import Any

from trialflow.verl.convert import (
    ConversionError,
    ConvertConfig,
    ConvertedTrial,
    LoopSample,
    convert_trial,
    extra_fields,
    loop_metrics,
)
from trialflow.verl.signal import step_metrics
from trialflow.verl.step_batch import StepBatch, StepTrial, StragglerPolicy, load_trajectory, run_step

_AGENT_LOOP = {
    "LoopConfig",
    "ReplicaDiscoveryError",
    "SampleIdentity",
    "TemporalAgentLoop",
    "TemporalAgentLoopManager",
    "TrialIdentityError",
    "TrialRow",
    "UnsupportedTrainer",
    "check_trainer",
    "resolve_identity",
    "stamp_identity",
    "verl_replica_urls",
}

__all__ = [
    "ConversionError",
    "ConvertConfig",
    "ConvertedTrial",
    "LoopSample",
    "StepBatch",
    "StepTrial",
    "StragglerPolicy",
    "convert_trial",
    "extra_fields",
    "load_trajectory",
    "loop_metrics",
    "run_step",
    "step_metrics",
    *sorted(_AGENT_LOOP),
]


def __getattr__(name: str) -> Any:
    if name in _AGENT_LOOP:
        from trialflow.verl import agent_loop

        return getattr(agent_loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
