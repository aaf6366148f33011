"""The contract types: a trial's sampling settings are checked when its spec is made."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.chat import SamplingParams
from trialflow import batch
from workflows.shared import Sampling, TrialResult, TrialSpec

TASK = "examples/tasks/create-file"


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"max_token": 256}, "max_token"),  # a typo is an unknown field, not ignored
        ({"temperature": True}, "temperature"),  # a bool is not a number here
        ({"max_tokens": "256"}, "max_tokens"),  # no string coercion
        ({"max_tokens": 0}, "max_tokens"),
        ({"top_p": 1.5}, "top_p"),
        ({"temperature": -0.1}, "temperature"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_bad_sampling_is_refused_when_the_specs_are_made(sampling, field):
    with pytest.raises(ValidationError) as err:
        batch.make_specs("b", [TASK], "oracle", sampling=sampling)
    assert field in str(err.value)


def test_sampling_overrides_only_what_was_set():
    spec = batch.make_specs("b", [TASK], "oracle", sampling={"max_tokens": 256, "stop": ["</x>"]})[0]
    assert spec.sampling.overrides() == {"max_tokens": 256, "stop": ("</x>",)}
    merged = SamplingParams(temperature=0.6, **spec.sampling.overrides())
    assert (merged.max_tokens, merged.temperature, merged.stop) == (256, 0.6, ("</x>",))
    assert TrialSpec(batch_id="b", task_path=TASK, task_name="t", scaffold="nop").sampling.overrides() == {}


def test_a_spec_survives_its_json_round_trip_and_old_dict_payloads():
    spec = batch.make_specs("b", [TASK], "oracle", sampling={"temperature": 1, "seed": 7})[0]
    again = TrialSpec.model_validate_json(spec.model_dump_json())
    assert again == spec and again.sampling.temperature == 1.0
    # A spec recorded before Sampling existed (a plain dict) still loads.
    old = {"batch_id": "b", "task_path": TASK, "task_name": "t", "scaffold": "nop", "sampling": {}}
    assert TrialSpec.model_validate(old).sampling == Sampling()


def test_result_of_a_spec_carries_its_identity():
    spec = batch.make_specs("b", [TASK], "oracle", samples=2)[1]
    result = TrialResult.of(spec, termination_reason="submitted", reward=1.0)
    assert (result.trial_id, result.batch_id, result.task_name, result.scaffold, result.sample_index) == (
        spec.trial_id,
        "b",
        "create-file",
        "oracle",
        1,
    )
