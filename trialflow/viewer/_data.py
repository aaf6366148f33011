"""What the viewer reads from the store, as view models (blocking; the server runs these in a
thread). The only I/O of the viewer besides the server itself.

Everything is read through `trialflow.storage` (the store layout, `load_attempt`, the one
trajectory reader) and `trialflow.inspection` (verifier output). Bounds, so a huge trial never
makes a huge page or a huge process: the index lists `BATCHES_PER_PAGE` batches, a batch page
`TRIALS_PER_PAGE` trials, a unit shows
`LOGS_SHOWN` log files, each its last `LOG_TAIL_BYTES`, and decoded trajectories are kept in a
small LRU (`CACHE_SIZE`).

Errors a user can cause (an unknown batch or trial, a missing store, a corrupt result or
trajectory) are `ViewerError`s with a one-line message and an HTTP status; a corrupt
trajectory is shown as its attempt's error, the rest of the trial still renders.
"""

from __future__ import annotations

import functools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from proxy.trajectory import Trajectory
from trialflow.errors import ObjectNotFound, StorageError
from trialflow.storage import (
    AttemptRecord,
    LoadedAttempt,
    ResultStore,
    TrialKeys,
    load_attempt,
    trial_result_key,
)
from workflows.shared import TrialResult

TRIALS_PER_PAGE = 100
BATCHES_PER_PAGE = 100
LOG_TAIL_BYTES = 64 << 10
LOGS_SHOWN = 20
CACHE_SIZE = 4


class ViewerError(Exception):
    """A page that cannot be shown: one line for the user, the HTTP status to answer with."""

    status = 500

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status


class NotFound(ViewerError):
    status = 404


@dataclass(frozen=True)
class BatchEntry:
    batch_id: str
    trials: int


@dataclass(frozen=True)
class TrialRow:
    """One trial of a batch page: its result, or why it could not be read."""

    trial_id: str
    result: TrialResult | None
    error: str | None = None


@dataclass(frozen=True)
class BatchPage:
    batch_id: str
    rows: list[TrialRow]
    total: int
    offset: int


@dataclass(frozen=True)
class Unit:
    """One model session of a trial: an attempt, or one step of a multi-step attempt."""

    attempt: int
    step: str | None  # the step's folder (TaskStep.key), None: single-step
    keys: TrialKeys

    @property
    def label(self) -> str:
        return f"attempt {self.attempt}" + (f", step {self.step}" if self.step else "")


@dataclass(frozen=True)
class LogText:
    text: str
    cut: int  # bytes left out before the tail shown


@dataclass(frozen=True)
class UnitView:
    unit: Unit
    loaded: LoadedAttempt
    logs: dict[str, LogText]  # scaffold.log, scaffold/..., verifier/... (artifacts left out)
    logs_left_out: list[str] = field(default_factory=list)  # past LOGS_SHOWN


@dataclass(frozen=True)
class TrialPage:
    result: TrialResult
    units: list[UnitView]
    replays: list[dict[str, Any]]  # stored `replay --from-record` reports, oldest first


def list_batches(store: ResultStore, offset: int = 0) -> tuple[list[BatchEntry], int]:
    """`BATCHES_PER_PAGE` of the store's batches from ``offset``, each with its trial count
    (one listing per batch shown), and how many batches there are."""
    ids = _guard(lambda: store.list_children("batches/"))
    return [
        BatchEntry(b, len(_guard(functools.partial(store.list_children, f"batches/{b}/trials/"))))
        for b in ids[offset : offset + BATCHES_PER_PAGE]
    ], len(ids)


def batch_page(store: ResultStore, batch_id: str, offset: int = 0) -> BatchPage:
    _check_id(batch_id, "batch")
    ids = _guard(lambda: store.list_children(f"batches/{batch_id}/trials/"))
    if not ids:
        raise NotFound(f"no batch {batch_id!r} in this store")
    rows = [_trial_row(store, batch_id, t) for t in ids[offset : offset + TRIALS_PER_PAGE]]
    return BatchPage(batch_id, rows, len(ids), offset)


def _trial_row(store: ResultStore, batch_id: str, trial_id: str) -> TrialRow:
    try:
        return TrialRow(trial_id, read_result(store, batch_id, trial_id))
    except ViewerError as err:
        return TrialRow(trial_id, None, str(err))


def read_result(store: ResultStore, batch_id: str, trial_id: str) -> TrialResult:
    try:
        raw = _guard(lambda: store.get_bytes(trial_result_key(batch_id, trial_id)))
    except ObjectNotFound:
        raise NotFound(
            f"no stored result for trial {trial_id!r} of batch {batch_id!r} (still running, or it never finished)"
        ) from None
    try:
        return TrialResult.model_validate_json(raw)
    except ValidationError as err:
        raise ViewerError(
            f"the stored result of {trial_id!r} is not a trial result ({err.error_count()} errors)"
        ) from None


def find_batch(store: ResultStore, trial_id: str) -> str:
    """The batch of a trial id ``trial-{batch}-{task}-{sample}``: each reading of the id's
    dashes is tried against the store (a batch id may hold dashes too)."""
    _check_id(trial_id, "trial")
    if trial_id.startswith("trial-"):
        rest = trial_id[len("trial-") :]
        for i in [i for i, c in enumerate(rest) if c == "-"]:
            if _guard(functools.partial(store.exists, trial_result_key(rest[:i], trial_id))):
                return rest[:i]
    raise NotFound(f"no trial {trial_id!r} in this store (give ?batch= if its id names no batch)")


def trial_page(store: ResultStore, result: TrialResult, cache: TrajectoryCache) -> TrialPage:
    units = [UnitView(u, cache.get(store, u, result), *_logs(store, u)) for u in trial_units(store, result)]
    return TrialPage(result, units, _replays(store, result))


def trial_units(store: ResultStore, result: TrialResult) -> list[Unit]:
    """Every attempt of the trial, each step of a multi-step attempt as its own unit."""
    units = []
    for record in result.attempt_records:
        keys = TrialKeys(result.batch_id, result.trial_id, record.attempt)
        steps = _guard(functools.partial(store.list_children, f"{keys.root}/steps/"))
        if not steps:
            units.append(Unit(record.attempt, None, keys))
        for step in steps:
            units.append(
                Unit(record.attempt, step, TrialKeys(keys.batch_id, keys.trial_id, keys.attempt, step))
            )
    return units


def find_unit(units: Sequence[Unit], attempt: int | None, step: str | None) -> Unit:
    """The unit a turn or segment URL names: the last attempt's (last step's) by default."""
    if not units:
        raise NotFound("this trial has no attempt with a model session")
    want = attempt if attempt is not None else units[-1].attempt
    chosen = [u for u in units if u.attempt == want and (step is None or u.step == step)]
    if not chosen:
        raise NotFound(f"no attempt {want}" + (f" step {step!r}" if step else "") + " in this trial")
    return chosen[-1]


def _record_of(store: ResultStore, result: TrialResult, unit: Unit) -> AttemptRecord:
    """The attempt's record; a step's is made from the step's own keys (same reader rules)."""
    record = next(r for r in result.attempt_records if r.attempt == unit.attempt)
    if unit.step is None:
        return record
    final = unit.keys.trajectory
    done = _guard(lambda: store.exists(final))
    return AttemptRecord(
        attempt=unit.attempt,
        checkpoints_uri=store.uri(unit.keys.checkpoints) + "/",
        trajectory_uri=store.uri(final) if done else None,
        complete=done or record.complete,
    )


class TrajectoryCache:
    """The last `CACHE_SIZE` final trajectories read (a page and its turn pages read the same
    one). Trajectories rebuilt from checkpoints are read again each time: they may still grow."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, int, str | None], LoadedAttempt] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, store: ResultStore, unit: Unit, result: TrialResult) -> LoadedAttempt:
        key = (result.trial_id, unit.attempt, unit.step)
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        try:
            loaded = load_attempt(store, _record_of(store, result, unit))
        except ValueError as err:  # a record naming another store
            loaded = LoadedAttempt(result.attempt_records[0], None, "none", error=str(err))
        if loaded.source != "final":  # a running or lost attempt's checkpoints may still grow
            return loaded
        with self._lock:
            self._items[key] = loaded
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return loaded


# The logs every unit has read first; then the rest by name, up to `LOGS_SHOWN` files.
_FIRST_LOGS = ("scaffold.log", "verifier/stdout.txt", "verifier/stderr.txt")


def _logs(store: ResultStore, unit: Unit) -> tuple[dict[str, LogText], list[str]]:
    """The unit's logs (the agent's and the verifier's), each its last `LOG_TAIL_BYTES`, at
    most `LOGS_SHOWN` files (an agent can leave a thousand files in /logs/verifier); and the
    names of those left out."""
    prefix = f"{unit.keys.root}/logs/"
    names = [
        k[len(prefix) :] for k in _guard(lambda: store.list_keys(prefix))
        if not k[len(prefix) :].startswith("artifacts/")
    ]  # fmt: skip
    names.sort(key=lambda n: (n not in _FIRST_LOGS, _FIRST_LOGS.index(n) if n in _FIRST_LOGS else 0, n))
    return {n: _tail(store, prefix + n) for n in names[:LOGS_SHOWN]}, names[LOGS_SHOWN:]


def _tail(store: ResultStore, key: str) -> LogText:
    try:
        data = _guard(lambda: store.get_bytes(key))
    except (ViewerError, ObjectNotFound) as err:
        return LogText(f"(could not read: {err})", 0)
    cut = max(0, len(data) - LOG_TAIL_BYTES)
    return LogText(data[cut:].decode("utf-8", "replace"), cut)


def _replays(store: ResultStore, result: TrialResult) -> list[dict[str, Any]]:
    prefix = f"batches/{result.batch_id}/trials/{result.trial_id}/replays/"
    reports = []
    for key in _guard(lambda: store.list_keys(prefix)):
        try:
            reports.append(json.loads(_guard(functools.partial(store.get_bytes, key))))
        except (ViewerError, ValueError) as err:
            reports.append({"name": key[len(prefix) :], "error": f"unreadable report: {err}"})
    return reports


def _check_id(value: str, what: str) -> None:
    if not value or "/" in value or value in (".", ".."):
        raise NotFound(f"{what} id {value!r} is not one")


def _guard(fn: Callable[[], Any]) -> Any:
    """Store failures as one-line viewer errors (a missing key stays ObjectNotFound)."""
    try:
        return fn()
    except ObjectNotFound:
        raise
    except (StorageError, ValueError) as err:
        raise ViewerError(f"the store could not be read: {err}", 502) from None


def load_tokenizer(model_dir: Any) -> Any:
    """The model's tokenizer for decoding tokens, or None when no directory is given."""
    if model_dir is None:
        return None
    from transformers import AutoTokenizer  # heavy: only when a model directory is given

    return AutoTokenizer.from_pretrained(str(model_dir))


def trajectory_of(loaded: LoadedAttempt) -> Trajectory:
    if loaded.trajectory is None:
        raise NotFound(f"{loaded.record.attempt}: no trajectory ({loaded.error or 'no model session'})")
    return loaded.trajectory
