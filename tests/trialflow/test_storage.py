"""One suite for every ResultStore: LocalStore (directory) and S3Store (real SeaweedFS)."""

import asyncio
import uuid

import pytest

from proxy.checkpoint import CheckpointSink
from proxy.trajectory import Trajectory
from tests.verl._support import Turn, add_segment
from trialflow.errors import ObjectNotFound, StorageError
from trialflow.storage import (
    AttemptRecord,
    LocalStore,
    ResultStore,
    S3Store,
    StoreCheckpointSink,
    TrialKeys,
    load_attempt,
    trial_result_key,
)
from workflows.shared import TrialResult


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request, tmp_path) -> ResultStore:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    bucket = request.getfixturevalue("s3_endpoint")
    return S3Store(
        bucket.endpoint_url,
        bucket.bucket,
        prefix=f"t-{uuid.uuid4().hex[:8]}",
        access_key=bucket.access_key,
        secret_key=bucket.secret_key,
    )


def test_key_layout():
    k = TrialKeys("b1", "trial-b1-x-0", 2)
    assert k.trajectory == "batches/b1/trials/trial-b1-x-0/attempt-2/trajectory.npz"
    assert k.checkpoint(7) == "batches/b1/trials/trial-b1-x-0/attempt-2/checkpoints/000007.npz"
    assert k.log("scaffold.log") == "batches/b1/trials/trial-b1-x-0/attempt-2/logs/scaffold.log"
    assert trial_result_key("b1", "trial-b1-x-0") == "batches/b1/trials/trial-b1-x-0/result.json"
    assert not hasattr(k, "result")  # one result per trial, none per attempt
    with pytest.raises(ValueError):
        k.log("../escape")


def test_put_get_roundtrip_by_key_and_uri(store):
    data = bytes(range(256)) * 100
    uri = store.put_bytes("a/b/c.bin", data)
    assert uri == store.uri("a/b/c.bin")
    assert store.get_bytes("a/b/c.bin") == data
    assert store.get_bytes(uri) == data
    assert store.exists("a/b/c.bin") and store.exists(uri)
    store.put_bytes("a/b/c.bin", b"v2", content_type="text/plain")  # overwrite
    assert store.get_bytes(uri) == b"v2"
    assert store.put_bytes("empty", b"") and store.get_bytes("empty") == b""


def test_missing_objects(store):
    assert not store.exists("nope/x")
    with pytest.raises(ObjectNotFound) as exc:
        store.get_bytes("nope/x")
    assert not exc.value.retryable and isinstance(exc.value, KeyError)


def test_list_keys_by_prefix(store):
    for key in ["batches/1/x", "batches/1/y/z", "batches/10/q", "other"]:
        store.put_bytes(key, b"1")
    assert store.list_keys("batches/1/") == ["batches/1/x", "batches/1/y/z"]
    assert store.list_keys("batches/1") == ["batches/1/x", "batches/1/y/z", "batches/10/q"]
    assert store.list_keys() == ["batches/1/x", "batches/1/y/z", "batches/10/q", "other"]
    assert store.list_keys("none/") == []


def test_list_children_lists_one_level(store):
    for key in ["batches/1/x", "batches/1/y/z", "batches/1/y/w", "batches/10/q", "other"]:
        store.put_bytes(key, b"1")
    assert store.list_children("") == ["batches", "other"]
    assert store.list_children("batches/") == ["1", "10"]
    assert store.list_children("batches/1/") == ["x", "y"]
    assert store.list_children("batches/1/x/") == [] and store.list_children("none/") == []
    with pytest.raises(ValueError):
        store.list_children("../")


@pytest.mark.parametrize("bad", ["", "/abs", "a//b", "a/../b", "./a", "a/."])
def test_invalid_keys(store, bad):
    with pytest.raises(ValueError):
        store.put_bytes(bad, b"x")


def test_foreign_uri_is_rejected(store, tmp_path):
    foreign = (
        "s3://another-bucket/x" if isinstance(store, S3Store) else (tmp_path / "elsewhere" / "x").as_uri()
    )
    with pytest.raises(ValueError, match="outside this store"):
        store.get_bytes(foreign)


async def test_async_helpers_and_checkpoint_sink(store):
    keys = TrialKeys("b", "t", 1)
    sink: CheckpointSink = StoreCheckpointSink(store, keys.checkpoints)
    await asyncio.gather(*(sink.write("sess", seq, f"delta-{seq}".encode()) for seq in range(3)))
    assert store.list_keys(keys.checkpoints) == [keys.checkpoint(i) for i in range(3)]
    assert await store.get(keys.checkpoint(2)) == b"delta-2"
    uri = await store.put(trial_result_key("b", "t"), b"{}")
    assert uri == store.uri(trial_result_key("b", "t"))
    assert sink.key(5) == keys.checkpoint(5)  # one key format


def test_local_store_writes_atomically_and_hides_temp_files(tmp_path):
    store = LocalStore(tmp_path / "s")
    (tmp_path / "s" / "d").mkdir()
    (tmp_path / "s" / "d" / ".tmp-abandoned").write_bytes(b"partial")
    store.put_bytes("d/final", b"x")
    assert store.list_keys() == ["d/final"]
    assert store.uri("d/final").startswith("file://")


def test_s3_unreachable_endpoint_is_retryable_storage_error():
    store = S3Store("http://127.0.0.1:9", "b", access_key="a", secret_key="b", connect_timeout_s=0.5)
    with pytest.raises(StorageError) as exc:
        store.put_bytes("k", b"x")
    assert exc.value.retryable and not isinstance(exc.value, ObjectNotFound)


@pytest.mark.s3
def test_s3_create_bucket_and_prefix_layout(s3_endpoint):
    bucket = f"tf-{uuid.uuid4().hex[:10]}"
    store = S3Store(
        s3_endpoint.endpoint_url,
        bucket,
        prefix="/runs/",
        access_key=s3_endpoint.access_key,
        secret_key=s3_endpoint.secret_key,
        create_bucket=True,
    )
    uri = store.put_bytes("x/y", b"1")
    assert uri == f"s3://{bucket}/runs/x/y"
    raw = s3_endpoint.client().get_object(Bucket=bucket, Key="runs/x/y")["Body"].read()
    assert raw == b"1"
    S3Store(
        s3_endpoint.endpoint_url,
        bucket,
        access_key=s3_endpoint.access_key,
        secret_key=s3_endpoint.secret_key,
        create_bucket=True,
    )  # exists: fine


def _two_turn_checkpoints(store: ResultStore, keys: TrialKeys) -> Trajectory:
    """Write a two-turn trajectory's per-turn deltas as the session's sink would; return it."""
    traj = Trajectory(session_id="sess")
    mark = traj.mark()
    for seq, prompt in enumerate(([1, 2, 3], [7, 8])):
        add_segment(traj, prompt, [Turn(gen=[4, 5, 6])])
        store.put_bytes(keys.checkpoint(seq), traj.delta_since(mark))
        mark = traj.mark()
    return traj


def test_one_loader_for_final_lost_and_model_free_attempts(store):
    keys = TrialKeys("b", "t", 1)
    traj = _two_turn_checkpoints(store, keys)
    lost = AttemptRecord.begun(1, store.uri(keys.root))
    assert lost.checkpoints_uri == store.uri(keys.checkpoints) + "/" and lost.uri == lost.checkpoints_uri
    got = load_attempt(store, lost)
    assert (got.source, got.partial, got.checkpoints, got.error) == ("checkpoints", True, 2, None)
    assert got.trajectory.to_bytes() == traj.to_bytes()  # exactly the pre-crash tokens

    final_uri = store.put_bytes(keys.trajectory, traj.to_bytes())
    done = lost.finished(final_uri)
    got = load_attempt(store, done)
    assert (got.source, got.partial, done.uri) == ("final", False, final_uri)
    assert got.trajectory.to_bytes() == traj.to_bytes()

    model_free = AttemptRecord.begun(2, store.uri(TrialKeys("b", "t", 2).root)).finished(None)
    got = load_attempt(store, model_free)
    assert (got.source, got.trajectory, got.error, model_free.uri) == ("none", None, None, None)

    early = load_attempt(store, AttemptRecord.begun(3, store.uri(TrialKeys("b", "t", 3).root)))
    assert early.source == "none" and "before its first checkpoint" in early.error

    store.put_bytes(TrialKeys("b", "t", 4).checkpoint(0), b"not npz")
    broken = load_attempt(store, AttemptRecord.begun(4, store.uri(TrialKeys("b", "t", 4).root)))
    assert broken.source == "none" and broken.error.startswith("TrajectoryError")

    result = TrialResult(
        trial_id="t",
        batch_id="b",
        task_name="x",
        scaffold="s",
        sample_index=0,
        termination_reason="infra_error",
        attempt_records=[done, model_free, lost],
    )
    again = TrialResult.model_validate_json(result.model_dump_json())
    assert again.last_attempt == lost and again.trajectory_uris == [final_uri, lost.checkpoints_uri]


def test_put_once_keeps_the_first_write(store):
    from trialflow.errors import ObjectExists

    uri = store.put_once("a/result.json", b'{"reward": 0}')
    assert store.put_once("a/result.json", b'{"reward": 0}') == uri  # a retried write: fine
    with pytest.raises(ObjectExists) as exc:
        store.put_once("a/result.json", b'{"reward": 1}')
    assert not exc.value.retryable
    assert store.get_bytes(uri) == b'{"reward": 0}'
    assert store.list_keys("a/") == ["a/result.json"]  # no temp file left behind


def test_delete_removes_and_tolerates_missing(store):
    store.put_bytes("proxies/w.json", b"{}")
    store.delete("proxies/w.json")
    store.delete("proxies/w.json")
    assert not store.exists("proxies/w.json") and store.list_keys("proxies/") == []


def test_put_file_streams_a_file_from_disk(store, tmp_path):
    src = tmp_path / "artifact.bin"
    data = bytes(range(256)) * 20_000  # 5 MB: more than one read block
    src.write_bytes(data)
    uri = store.put_file("batches/b/trials/t/attempt-1/logs/artifacts/artifact.bin", src)
    assert store.get_bytes(uri) == data
