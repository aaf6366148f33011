"""The contract types: a trial's sampling settings are checked when its spec is made."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from proxy.chat import SamplingParams
from trialflow import batch
from workflows.shared import (
    AttemptRecord,
    Sampling,
    ScaffoldOutput,
    StepResult,
    TrialCounters,
    TrialResult,
    TrialSpec,
)
from workflows.trial import _steps_outcome

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


HISTORIES = Path(__file__).parent / "histories"


def _recorded_payloads(event_type: str) -> list[dict[str, Any]]:
    """Every JSON object a checked-in history carries as a result of `event_type` events."""
    found = []
    for path in sorted(HISTORIES.glob("*.json")):
        for event in json.loads(path.read_text())["events"]:
            if event["eventType"] != event_type:
                continue
            attrs = next(v for k, v in event.items() if k.endswith("Attributes"))
            for payload in (attrs.get("result") or {}).get("payloads", []):
                value = json.loads(base64.b64decode(payload["data"]))
                if isinstance(value, dict):
                    found.append(value)
    return found


# Lists of models inside a result: compared key by key too (they may gain fields).
_NESTED: dict[str, type[BaseModel]] = {"step_results": StepResult, "attempt_records": AttemptRecord}


def _same_for_every_old_key(model: type[BaseModel], old: dict[str, Any], new: dict[str, Any]) -> None:
    """Every key of `old` that `model` still has is in `new` with the same value (keys that an
    earlier change dropped, such as `trajectory_uris`, are ignored when loading)."""
    for key, value in old.items():
        if key not in model.model_fields:
            continue
        assert key in new, (key, old)
        if key in _NESTED:
            for a, b in zip(value, new[key], strict=True):
                _same_for_every_old_key(_NESTED[key], a, b)
        else:
            assert new[key] == value, (key, value, new[key])


def test_recorded_results_load_and_keep_their_flat_keys():
    """Trial results and scaffold outputs recorded before the counters were one definition
    (TrialCounters) load, and dump again with every key they had at the same place and value:
    the counters stay flat fields, not a nested object."""
    results = _recorded_payloads("EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED")
    scaffolds = [
        p
        for p in _recorded_payloads("EVENT_TYPE_ACTIVITY_TASK_COMPLETED")
        if "termination_reason" in p and "trial_id" not in p
    ]
    assert len(results) >= 6 and len(scaffolds) >= 6
    assert any(r.get("step_results") for r in results)  # a multi-step trial's StepResults too
    for model, recorded in ((TrialResult, results), (ScaffoldOutput, scaffolds)):
        for old in recorded:
            new = model.model_validate_json(json.dumps(old)).model_dump(mode="json")
            _same_for_every_old_key(model, old, new)
            assert {k: new[k] for k in TrialCounters.model_fields} == {
                k: old.get(k, 0) for k in TrialCounters.model_fields
            }


def test_counters_are_copied_and_summed_by_name():
    out = ScaffoldOutput(
        termination_reason="submitted", turns=3, replayed_turns=1, tool_calls=2, prompt_tokens=10,
        response_tokens=4, rewrites_client=1, rewrites_template=0,
    )  # fmt: skip
    step = StepResult(name="a", **out.counters())
    assert step.counters() == out.counters() == {
        "turns": 3, "replayed_turns": 1, "tool_calls": 2, "prompt_tokens": 10, "response_tokens": 4,
        "rewrites_client": 1, "rewrites_template": 0,
    }  # fmt: skip
    assert TrialCounters.summed([out, step])["tool_calls"] == 4
    assert TrialCounters.summed([]) == dict.fromkeys(TrialCounters.model_fields, 0)
    # a StepResult stored before it had every counter loads them as 0
    assert StepResult.model_validate({"name": "old", "turns": 2}).counters()["tool_calls"] == 0


def test_a_multi_step_attempt_sums_every_counter_over_its_steps():
    steps = [
        StepResult(name="a", reward_valid=True, termination_reason="submitted", turns=2, tool_calls=1,
                   prompt_tokens=5, rewrites_client=1),
        StepResult(name="b", reward_valid=True, termination_reason="submitted", turns=3, tool_calls=2,
                   replayed_turns=1, response_tokens=7),
    ]  # fmt: skip
    scaffold, _ = _steps_outcome(steps, None)
    assert scaffold.counters() == {
        "turns": 5, "replayed_turns": 1, "tool_calls": 3, "prompt_tokens": 5, "response_tokens": 7,
        "rewrites_client": 1, "rewrites_template": 0,
    }  # fmt: skip
