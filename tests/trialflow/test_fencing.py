"""trialflow.fencing: the trial's fence refuses a lost attempt's writes; a host's lease.

On the real local store (a directory) and on SeaweedFS S3 (the `s3` marker): the fence is a
record in the store, checked by the store wrapper before and after each write.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from trialflow.errors import AttemptFenced, StorageError
from trialflow.fencing import (
    FencedStore,
    FenceRecord,
    HeldSandbox,
    HostLease,
    fence_attempt,
    read_fence,
)
from trialflow.storage import (
    LocalStore,
    ResultStore,
    S3Store,
    TrialKeys,
    attempt_of_key,
    host_registry_key,
    trial_fence_key,
    trial_result_key,
)


def test_attempt_of_key_names_only_keys_inside_an_attempt():
    keys = TrialKeys("b1", "trial-b1-t-0", 3)
    assert attempt_of_key(keys.trajectory) == ("b1", "trial-b1-t-0", 3)
    assert attempt_of_key(keys.checkpoint(7)) == ("b1", "trial-b1-t-0", 3)
    assert attempt_of_key(TrialKeys("b1", "t", 2, step="s1").log("x.log")) == ("b1", "t", 2)
    assert attempt_of_key(trial_result_key("b1", "t")) is None
    assert attempt_of_key(trial_fence_key("b1", "t")) is None
    assert attempt_of_key("batches/b1/trials/t/attempt-x/trajectory.npz") is None
    assert attempt_of_key(host_registry_key("w1")) is None


def _stores(tmp_path: Path, request) -> ResultStore:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    s3 = request.getfixturevalue("s3_endpoint")
    return S3Store(
        s3.endpoint_url,
        s3.bucket,
        f"fence-{uuid.uuid4().hex[:8]}",
        access_key=s3.access_key,
        secret_key=s3.secret_key,
        create_bucket=True,
    )


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(tmp_path, request) -> ResultStore:
    return _stores(tmp_path, request)


def test_a_fenced_attempt_writes_nothing_and_later_attempts_write(store):
    fenced = FencedStore(store)
    one, two = TrialKeys("b", "t", 1), TrialKeys("b", "t", 2)
    fenced.put_bytes(one.checkpoint(0), b"turn 0")  # before the fence: kept
    record = fence_attempt(store, "b", "t", 1, "trialflow-host-a-w1", "ActivityTimeout.HEARTBEAT")
    assert record.epoch == 2 and [f.host_queue for f in record.fenced] == ["trialflow-host-a-w1"]
    for write in (
        lambda: fenced.put_bytes(one.trajectory, b"late"),
        lambda: fenced.put_once(one.log("scaffold.log"), b"late"),
        lambda: fenced.put_bytes(one.checkpoint(1), b"turn 1"),
    ):
        with pytest.raises(AttemptFenced, match="attempt 1 of t was declared lost"):
            write()
    assert store.list_keys("batches/b/trials/t/attempt-1/") == [one.checkpoint(0)]
    assert store.get_bytes(one.checkpoint(0)) == b"turn 0"
    fenced.put_bytes(two.trajectory, b"attempt 2")  # the next attempt writes
    fenced.put_bytes(trial_result_key("b", "t"), b"{}")  # outside any attempt
    assert store.get_bytes(two.trajectory) == b"attempt 2"


def test_a_second_store_object_sees_the_fence_without_a_cache(store, tmp_path):
    """Two hosts: the fence is written through one, the lost host writes through another."""
    lost_host = FencedStore(store)
    keys = TrialKeys("b", "t", 1)
    lost_host.put_bytes(keys.checkpoint(0), b"x")  # its cache: nothing fenced yet
    fence_attempt(store, "b", "t", 1, "q", "lost")
    with pytest.raises(AttemptFenced):
        lost_host.put_bytes(keys.trajectory, b"late")
    assert not store.exists(keys.trajectory)


def test_a_write_that_lands_while_the_fence_does_is_removed(store):
    """The fence lands between the wrapper's first check and its write: the second check
    finds it and the write is deleted again."""

    class FenceDuringWrite(FencedStore):
        def _guarded(self, key, write):
            def write_then_fence():
                uri = write()
                fence_attempt(self.inner, "b", "t", 1, "q", "lost")
                return uri

            return super()._guarded(key, write_then_fence)

    keys = TrialKeys("b", "t", 1)
    with pytest.raises(AttemptFenced):
        FenceDuringWrite(store).put_bytes(keys.trajectory, b"raced")
    assert not store.exists(keys.trajectory)


def test_fencing_is_idempotent_and_the_epoch_only_grows(store):
    fence_attempt(store, "b", "t", 2, "q2", "lost")
    fence_attempt(store, "b", "t", 2, "q2", "lost")  # a retried activity
    record = fence_attempt(store, "b", "t", 1, "q1", "lost")  # an older one, late
    assert record.epoch == 3 and [f.attempt for f in record.fenced] == [2, 1]
    assert read_fence(store, "b", "t") == record
    assert read_fence(store, "b", "other") == FenceRecord()


def test_an_unreadable_fence_is_a_retryable_storage_error_not_no_fence(store):
    store.put_bytes(trial_fence_key("b", "t"), b"{not json")
    with pytest.raises(StorageError, match="unreadable"):
        FencedStore(store).put_bytes(TrialKeys("b", "t", 1).trajectory, b"x")
    assert not store.exists(TrialKeys("b", "t", 1).trajectory)


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Host:
    """The sandboxes a host holds, and the ones the lease made it remove."""

    def __init__(self, *held: HeldSandbox) -> None:
        self.sandboxes = {h.sandbox_id: h for h in held}
        self.removed: list[str] = []

    def held(self) -> list[HeldSandbox]:
        return list(self.sandboxes.values())

    async def forfeit(self, sandbox_id: str) -> None:
        self.removed.append(sandbox_id)
        self.sandboxes.pop(sandbox_id, None)


class _Unreachable(LocalStore):
    """The local store behind a cut link: every call fails as boto3's would."""

    down = False

    def put_bytes(self, key, data, content_type="application/octet-stream"):
        if self.down:
            raise StorageError("S3 put failed: Could not connect to the endpoint URL")
        return super().put_bytes(key, data, content_type)


async def test_a_host_removes_its_fenced_sandbox_and_re_registers(tmp_path):
    store = LocalStore(tmp_path / "store")
    host = _Host(HeldSandbox("sb-1", "b", "t1", 1), HeldSandbox("sb-2", "b", "t2", 1))
    lease = HostLease(store, "w1", "trialflow-host-a-w1", 60.0, clock=_Clock())
    first = await lease.check(host.held, host.forfeit)
    assert first.renewed and lease.accepting and first.registration == 1
    fence_attempt(store, "b", "t1", 1, "trialflow-host-a-w1", "lost")
    second = await lease.check(host.held, host.forfeit)
    assert second.forfeited == ["sb-1"] and host.removed == ["sb-1"]
    assert second.registration == 2 and lease.accepting  # re-registered in the same round
    assert b'"registration": 2' in store.get_bytes(host_registry_key("w1"))


async def test_a_lapsed_lease_forfeits_everything_and_blocks_new_sandboxes_until_renewed(tmp_path):
    store = _Unreachable(tmp_path / "store")
    clock = _Clock()
    host = _Host(HeldSandbox("sb-1", "b", "t1", 1), HeldSandbox("sb-2", "b", "t2", 3))
    lease = HostLease(store, "w1", "q", 30.0, clock=clock)
    await lease.check(host.held, host.forfeit)
    store.down = True  # the link is cut
    clock.now += 20
    assert not (await lease.check(host.held, host.forfeit)).renewed
    assert host.removed == [] and lease.accepting  # within the lease: kept
    clock.now += 15  # 35 s unrenewed
    lapsed = await lease.check(host.held, host.forfeit)
    assert lapsed.lapsed and sorted(host.removed) == ["sb-1", "sb-2"]
    assert not lapsed.renewed and not lease.accepting  # no new sandbox until re-registered
    clock.now += 60
    assert not (await lease.check(host.held, host.forfeit)).lapsed  # counted from a renewal
    store.down = False  # the link is back
    back = await lease.check(host.held, host.forfeit)
    assert back.renewed and lease.accepting and back.registration == 2


async def test_a_host_frozen_past_its_lease_forfeits_on_its_first_round_back(tmp_path):
    """SIGSTOP, not a cut link: no round ran at all; the first one after renews fine but the
    gap since the last renewal is over the lease."""
    store = LocalStore(tmp_path / "store")
    clock = _Clock()
    host = _Host(HeldSandbox("sb-1", "b", "t1", 1))
    lease = HostLease(store, "w1", "q", 30.0, clock=clock)
    await lease.check(host.held, host.forfeit)
    clock.now += 90
    back = await lease.check(host.held, host.forfeit)
    assert back.lapsed and back.renewed and host.removed == ["sb-1"] and lease.accepting
