"""What a worker's admission looks like from outside: ``admission/{worker_id}.json`` in the
store, written by the worker while it runs (and removed when it stops), read by
`trialflow status`. A report older than `STALE_S` is from a worker that died without
removing it."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field, ValidationError

from trialflow.errors import ObjectNotFound
from trialflow.storage import ResultStore, validate_key

ADMISSION_PREFIX = "admission/"
STALE_S = 120.0


def admission_key(worker_id: str) -> str:
    return validate_key(f"{ADMISSION_PREFIX}{worker_id}.json")


class AdmissionReport(BaseModel):
    worker_id: str
    mode: str  # "fixed" | "adaptive"
    ceiling: int
    sandbox_limit: int
    model_limit: int
    live_sandboxes: int
    sandboxes_in_use: int  # set-ups running + live sandboxes
    model_phase: int
    model_waiting: int
    binding: str  # "side:signal" (trialflow.admission._control.Binding)
    signals: dict[str, float] = Field(default_factory=dict)
    updated_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    def stale(self, now: datetime | None = None) -> bool:
        return ((now or datetime.now(UTC)) - self.updated_at).total_seconds() > STALE_S


def read_reports(store: ResultStore) -> tuple[list[AdmissionReport], dict[str, str]]:
    """(reports, {key: why not} for unreadable ones) under ``admission/``. Blocking."""
    reports, bad = [], {}
    for key in store.list_keys(ADMISSION_PREFIX):
        try:
            reports.append(AdmissionReport.model_validate_json(store.get_bytes(key)))
        except (ObjectNotFound, ValidationError, ValueError) as exc:
            bad[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return sorted(reports, key=lambda r: r.worker_id), bad
