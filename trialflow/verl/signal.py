"""What reached the loss this step, and what did not, by cause (pure: no verl, no I/O).

`step_metrics` folds the per-sample ``extra_fields`` the conversion writes
(`trialflow.verl.convert.extra_fields`, after the group policy of `trialflow.verl.groups`)
into flat numbers for verl's metrics dict. Every policy token of a step is either trained
or counted under exactly one cause, so ``tokens/generated == tokens/trained +
sum(tokens/dropped/*) + sum(tokens/masked/*)``:

- ``trialflow/tokens/generated``: tokens the policy generated (every segment of every trial);
- ``trialflow/tokens/trained``: of those, the ones with ``response_mask == 1``;
- ``trialflow/tokens/trained_fraction``: trained / generated (1.0 when nothing was generated);
- ``trialflow/tokens/dropped/{side,rewritten,step}``: segments that became no sample;
- ``trialflow/tokens/masked/{invalid,invalid_group,cut,overlong_filter}``: in a sample, masked;
- ``trialflow/trials``, ``trialflow/trials/invalid/{termination}``, ``trialflow/trials/overlong``,
  ``trialflow/samples/cut``, ``trialflow/samples_per_trial``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

PREFIX = "trialflow/"
MASK_CAUSES = ("invalid", "invalid_group", "cut", "overlong_filter")
DROP_KINDS = ("side", "rewritten", "step")


def step_metrics(samples: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Metrics over one step's samples (each a sample's ``extra_fields``)."""
    generated = trained = 0
    masked = dict.fromkeys(MASK_CAUSES, 0)
    dropped = dict.fromkeys(DROP_KINDS, 0)
    trials: dict[str, Mapping[str, Any]] = {}
    n_samples = cut = 0
    for s in samples:
        n_samples += 1
        trials.setdefault(str(s["trial_id"]), s)
        policy, kept = int(s["policy_tokens"]), int(s["trained_tokens"])
        generated += policy
        trained += kept
        cause = s.get("masked_by")
        if cause is not None:
            masked[cause] += policy - kept
        cut += bool(s.get("overlong"))
        for kind, n in (s.get("dropped_tokens") or {}).items():
            dropped[kind] = dropped.get(kind, 0) + int(n)
            generated += int(n)
    out: dict[str, float] = {
        "tokens/generated": generated,
        "tokens/trained": trained,
        "tokens/trained_fraction": trained / generated if generated else 1.0,
        **{f"tokens/dropped/{k}": v for k, v in dropped.items()},
        **{f"tokens/masked/{k}": v for k, v in masked.items()},
        "trials": len(trials),
        "trials/overlong": sum(t["termination_reason"] == "overlong" for t in trials.values()),
        "samples/cut": cut,
        "samples_per_trial": n_samples / len(trials) if trials else 0.0,
    }
    for t in trials.values():
        if not t["reward_valid"]:
            key = f"trials/invalid/{t['termination_reason']}"
            out[key] = out.get(key, 0) + 1
    return {PREFIX + k: float(v) for k, v in out.items()}
