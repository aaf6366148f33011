"""Fencing of lost attempts, and a host's lease on its sandboxes (docs/deploy.md, "Failover").

The rule: once the workflow has declared an attempt lost (its host's heartbeat or a host-queue
timeout ran out), nothing that attempt does afterwards may land in the store, and its sandbox
is not the workflow's concern any more: the host removes it itself.

- **Epochs.** An attempt's epoch is its number (`TrialKeys.attempt`). The trial's fence record,
  ``batches/{b}/trials/{t}/fence.json`` (`FenceRecord`), holds the lowest epoch still allowed to
  write; the workflow raises it (`fence_attempt`, from the `trial.fence_attempt` activity on the
  shared queue) before the next attempt starts.
- **Writes.** `FencedStore` wraps the store the activities write through. A write of a key inside
  an attempt's folder (`storage.attempt_of_key`: trajectory, checkpoints, logs, artifacts) reads
  the trial's fence before and after writing; a fenced attempt's write raises `AttemptFenced`,
  and one that landed while the fence was being written is deleted again. S3 has no write that is
  conditional on *another* object (SeaweedFS and S3 do `If-None-Match: *` on the key itself, used
  by `put_once`, and S3 `If-Match` on the same key's ETag; neither can say "only while fence.json
  says epoch <= n"), so what remains is a host that dies between its write and its second read:
  one stray object of an attempt already declared lost, which readers never follow (the lost
  attempt's `AttemptRecord` names its checkpoints, fixed when the fence landed, never a final
  trajectory).
- **Lease.** `HostLease` renews ``hosts/{worker_id}.json`` every `lease_s / 3`. A host that could
  not renew for `lease_s` has lost its lease: it removes every sandbox it holds (their attempts
  are, or will be, declared lost: their heartbeats could not reach Temporal either). A host that
  renews checks the fence of each trial it holds a sandbox of and removes the fenced ones. In both
  cases it re-registers (``registration`` + 1) before it takes another sandbox: until then the
  set-up activity refuses with `HostFenced` (retried elsewhere).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from trialflow.errors import AttemptFenced, ObjectNotFound, StorageError
from trialflow.storage import ResultStore, attempt_of_key, host_registry_key, trial_fence_key

log = logging.getLogger(__name__)


class FencedAttempt(BaseModel):
    """One attempt the workflow declared lost, and the host queue it was lost on."""

    attempt: int
    host_queue: str
    reason: str = ""


class FenceRecord(BaseModel):
    """A trial's fence: attempts numbered below `epoch` may write nothing more."""

    epoch: int = Field(default=1, ge=1)
    fenced: list[FencedAttempt] = Field(default_factory=list)

    def allows(self, attempt: int) -> bool:
        return attempt >= self.epoch


def read_fence(store: ResultStore, batch_id: str, trial_id: str) -> FenceRecord:
    """The trial's fence record (epoch 1, nothing fenced, when there is none). Blocking.
    A record that does not parse is a `StorageError` (retryable), never "no fence"."""
    try:
        raw = store.get_bytes(trial_fence_key(batch_id, trial_id))
    except ObjectNotFound:
        return FenceRecord()
    try:
        return FenceRecord.model_validate_json(raw)
    except ValidationError as err:
        raise StorageError(f"fence record of {trial_id} is unreadable: {err}") from None


def fence_attempt(
    store: ResultStore, batch_id: str, trial_id: str, attempt: int, host_queue: str, reason: str
) -> FenceRecord:
    """Raise the trial's epoch above `attempt` (idempotent: a retried call writes the same).
    Only the trial's workflow calls this, one attempt after another, so a plain read-modify-write
    has a single writer."""
    record = read_fence(store, batch_id, trial_id)
    if not any(f.attempt == attempt for f in record.fenced):
        record.fenced.append(FencedAttempt(attempt=attempt, host_queue=host_queue, reason=reason))
    record.epoch = max(record.epoch, attempt + 1)
    store.put_bytes(
        trial_fence_key(batch_id, trial_id), record.model_dump_json().encode(), "application/json"
    )
    return record


class FencedStore(ResultStore):
    """A store whose writes inside an attempt's folder are refused once the attempt is fenced
    (module docstring). Reads, listings, deletes and keys outside attempts pass through. The
    epochs seen are cached (they only grow), so a fenced attempt's next write costs no read."""

    def __init__(self, inner: ResultStore) -> None:
        self.inner = inner
        self._epochs: dict[tuple[str, str], int] = {}

    def _check(self, key: str) -> tuple[str, str, int] | None:
        owner = attempt_of_key(key)
        if owner is None:
            return None
        batch_id, trial_id, attempt = owner
        if attempt < self._epochs.get((batch_id, trial_id), 1):
            raise AttemptFenced(f"{key}: attempt {attempt} of {trial_id} was declared lost")
        epoch = read_fence(self.inner, batch_id, trial_id).epoch
        self._epochs[(batch_id, trial_id)] = epoch
        if attempt < epoch:
            raise AttemptFenced(f"{key}: attempt {attempt} of {trial_id} was declared lost")
        return owner

    def _guarded(self, key: str, write: Callable[[], str]) -> str:
        key = self.inner.key_of(key)
        if self._check(key) is None:
            return write()
        uri = write()
        try:
            self._check(key)
        except AttemptFenced:
            self.inner.delete(key)  # the fence landed while this write did
            raise
        return uri

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        return self._guarded(key, lambda: self.inner.put_bytes(key, data, content_type))

    def put_file(self, key: str, path: Path, content_type: str = "application/octet-stream") -> str:
        return self._guarded(key, lambda: self.inner.put_file(key, path, content_type))

    def put_once(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        return self._guarded(key, lambda: self.inner.put_once(key, data, content_type))

    def get_bytes(self, uri_or_key: str) -> bytes:
        return self.inner.get_bytes(uri_or_key)

    def list_keys(self, prefix: str = "") -> list[str]:
        return self.inner.list_keys(prefix)

    def list_children(self, prefix: str) -> list[str]:
        return self.inner.list_children(prefix)

    def exists(self, uri_or_key: str) -> bool:
        return self.inner.exists(uri_or_key)

    def delete(self, uri_or_key: str) -> None:
        self.inner.delete(uri_or_key)

    def uri(self, key: str) -> str:
        return self.inner.uri(key)

    def key_of(self, uri_or_key: str) -> str:
        return self.inner.key_of(uri_or_key)


@dataclass(frozen=True)
class HeldSandbox:
    """A sandbox this host holds, and the attempt it belongs to."""

    sandbox_id: str
    batch_id: str
    trial_id: str
    attempt: int


@dataclass
class LeaseRound:
    """What one `HostLease.check` did."""

    renewed: bool
    lapsed: bool = False  # the lease had run out before this round: every sandbox forfeited
    forfeited: list[str] = field(default_factory=list)  # sandbox ids removed this round
    registration: int = 0


class HostLease:
    """This host's registration in the store and its lease on the sandboxes it holds (module
    docstring). Each `check` is handed the sandboxes held now (`held`) and how to remove one
    (`forfeit`, never raises). `clock` is monotonic seconds (a test passes its own)."""

    def __init__(
        self,
        store: ResultStore,
        worker_id: str,
        host_queue: str,
        lease_s: float,
        *,
        address: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store, self._worker_id, self._queue = store, worker_id, host_queue
        self.lease_s = lease_s
        self._address, self._clock = address, clock
        self.registration = 0
        self._last_renewed: float | None = None
        self._must_register = True
        self._lock = asyncio.Lock()

    @property
    def accepting(self) -> bool:
        """Whether this host may take a new sandbox: registered, and no lapse or fence
        pending since."""
        return not self._must_register

    def _record(self) -> bytes:
        return json.dumps(
            {
                "worker_id": self._worker_id,
                "host_queue": self._queue,
                "registration": self.registration,
                "address": self._address,
                "renewed_at": time.time(),
                "lease_s": self.lease_s,
            }
        ).encode()

    async def _write(self) -> bool:
        try:
            await asyncio.to_thread(
                self._store.put_bytes, host_registry_key(self._worker_id), self._record(), "application/json"
            )
        except StorageError as err:
            log.warning("lease of %s not renewed: %s", self._worker_id, err)
            return False
        return True

    async def check(
        self, held: Callable[[], Iterable[HeldSandbox]], forfeit: Callable[[str], Awaitable[None]]
    ) -> LeaseRound:
        """One round: renew, forfeit what the lapse or the fences take, re-register if needed."""
        async with self._lock:
            started = self._clock()
            unrenewed = None if self._last_renewed is None else started - self._last_renewed
            report = LeaseRound(renewed=False, lapsed=unrenewed is not None and unrenewed > self.lease_s)
            if report.lapsed:
                log.warning("lease of %s lapsed (%.1fs unrenewed)", self._worker_id, unrenewed)
                self._must_register = True
                self._last_renewed = None  # the next lapse is counted from the next renewal
                for sandbox in list(held()):
                    await forfeit(sandbox.sandbox_id)
                    report.forfeited.append(sandbox.sandbox_id)
            if not await self._write():
                return report
            report.renewed = True
            self._last_renewed = started
            for sandbox in list(held()):
                try:
                    fence = await asyncio.to_thread(
                        read_fence, self._store, sandbox.batch_id, sandbox.trial_id
                    )
                except StorageError as err:
                    log.warning("fence of %s unreadable: %s", sandbox.trial_id, err)
                    continue
                if not fence.allows(sandbox.attempt):
                    log.warning(
                        "%s attempt %d was fenced: removing %s",
                        sandbox.trial_id,
                        sandbox.attempt,
                        sandbox.sandbox_id,
                    )
                    await forfeit(sandbox.sandbox_id)
                    report.forfeited.append(sandbox.sandbox_id)
                    self._must_register = True
            if self._must_register:
                self.registration += 1
                if await self._write():
                    self._must_register = False
                    log.info("%s registered (registration %d)", self._worker_id, self.registration)
            report.registration = self.registration
            return report

    async def unregister(self) -> None:
        """Remove the registration (a draining worker's last act); failure is only logged."""
        try:
            await asyncio.to_thread(self._store.delete, host_registry_key(self._worker_id))
        except StorageError as err:
            log.warning("registration of %s not removed: %s", self._worker_id, err)
