"""StragglerPolicy and the cancelled-trial record (pure); the policy end to end is in
test_step_pipeline.py (real Temporal/Docker/S3)."""

import pytest

from trialflow.verl.step_batch import StepBatch, StepTrial, StragglerPolicy, cancelled_result
from workflows.shared import TrialSpec


@pytest.mark.parametrize(
    ("mode", "fraction", "n", "quorum"),
    [
        ("all", 1.0, 64, 64),
        ("all", 0.5, 64, 64),
        ("fraction", 0.9, 64, 58),
        ("fraction", 0.01, 10, 1),
        ("fraction", 1.0, 3, 3),
        ("fraction", 0.5, 0, 0),
    ],
)
def test_quorum(mode, fraction, n, quorum):
    assert StragglerPolicy(mode=mode, fraction=fraction).quorum(n) == quorum


@pytest.mark.parametrize(
    "kwargs",
    [{"fraction": 0.0}, {"fraction": 1.5}, {"grace_s": -1}, {"deadline_s": -0.1}, {"cancel_wait_s": -1}],
)
def test_invalid_policies(kwargs):
    with pytest.raises(ValueError):
        StragglerPolicy(**kwargs)


def test_cancelled_record_and_gather_time():
    spec = TrialSpec(batch_id="b", task_path="/t/x", task_name="x", scaffold="oracle", sample_index=4)
    r = cancelled_result(spec, "cut")
    assert (r.trial_id, r.termination_reason, r.reward_valid, r.error.type) == (
        "trial-b-x-4",
        "cancelled",
        False,
        "StragglerCancelled",
    )
    batch = StepBatch(
        trials=[StepTrial(spec, r, result_s=3.0), StepTrial(spec, r, result_s=5.0)], started=0.0, ready_s=5.25
    )
    assert batch.last_result_s == 5.0 and batch.gather_s == pytest.approx(0.25)
