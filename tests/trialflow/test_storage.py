"""One suite for every ResultStore: LocalStore (directory) and S3Store (real SeaweedFS)."""

import asyncio
import uuid

import pytest

from proxy.checkpoint import CheckpointSink
from trialflow.errors import ObjectNotFound, StorageError
from trialflow.storage import (
    LocalStore,
    ResultStore,
    S3Store,
    StoreCheckpointSink,
    TrialKeys,
)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store(request, tmp_path) -> ResultStore:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    bucket = request.getfixturevalue("s3_endpoint")
    return S3Store(
        bucket.endpoint_url,
        bucket.bucket,
        prefix=f"t-{uuid.uuid4().hex[:8]}",
        access_key="any",
        secret_key="any",
    )


def test_key_layout():
    k = TrialKeys("b1", "trial-b1-x-0", 2)
    assert k.trajectory == "batches/b1/trials/trial-b1-x-0/attempt-2/trajectory.npz"
    assert k.checkpoint(7) == "batches/b1/trials/trial-b1-x-0/attempt-2/checkpoints/000007.npz"
    assert k.log("scaffold.log") == "batches/b1/trials/trial-b1-x-0/attempt-2/logs/scaffold.log"
    assert k.result == "batches/b1/trials/trial-b1-x-0/attempt-2/result.json"
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
    uri = await store.put(keys.result, b"{}")
    assert uri == store.uri(keys.result)


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
        s3_endpoint.endpoint_url, bucket, prefix="/runs/", access_key="a", secret_key="b", create_bucket=True
    )
    uri = store.put_bytes("x/y", b"1")
    assert uri == f"s3://{bucket}/runs/x/y"
    raw = s3_endpoint.client().get_object(Bucket=bucket, Key="runs/x/y")["Body"].read()
    assert raw == b"1"
    S3Store(
        s3_endpoint.endpoint_url, bucket, access_key="a", secret_key="b", create_bucket=True
    )  # exists: fine
