"""Result storage: `ResultStore` ABC with `S3Store` (boto3) and `LocalStore` (a directory).

Key layout (keys are relative to the store's own prefix; build them with `TrialKeys` and
`trial_result_key`, nowhere else)::

    batches/{batch_id}/trials/{trial_id}/result.json                          the trial's TrialResult
    batches/{batch_id}/trials/{trial_id}/fence.json                           the attempts declared lost
                                                                              (trialflow.fencing)
    batches/{batch_id}/trials/{trial_id}/attempt-{n}/trajectory.npz           final trajectory
    batches/{batch_id}/trials/{trial_id}/attempt-{n}/checkpoints/{seq:06d}.npz per-turn deltas
    batches/{batch_id}/trials/{trial_id}/attempt-{n}/logs/{name}              scaffold/verifier logs
    batches/{batch_id}/trials/{trial_id}/attempt-{n}/steps/{step}/...         a multi-step task's step:
                                                                              the same layout per step
    batches/{batch_id}/trials/{trial_id}/replays/{name}.json                   a `replay --from-record`'s
                                                                              report (record_replay_key)
    proxies/{worker_id}.json                                                  a live worker's proxy
                                                                              (trialflow.policy_sync)
    policy_version.json                                                       the weights version the
                                                                              trainer last announced
    hosts/{worker_id}.json                                                    a worker host's registration
                                                                              and lease (trialflow.fencing)

There is one result per trial (written by the last activity of the workflow), none per attempt.

Attempts: `AttemptRecord` says where one attempt's trajectory is (its final trajectory URI,
its checkpoint prefix, whether the attempt reported back); `TrialResult.attempt_records`
lists them. `load_attempt` is the one reader (CLI, inspection, verl): the final trajectory
when the attempt completed, else the trajectory rebuilt from its checkpoints (a lost host:
the tokens generated before the crash), flagged ``partial``.

URIs: `S3Store` returns `s3://{bucket}/{prefix}/{key}`, `LocalStore` returns
`file://{root}/{key}`. `get_bytes` accepts a key or a URI of the same store (a URI of
another bucket/root raises ValueError).

Retries: none of our own. boto3 is configured with `retries={"max_attempts": 1,
"mode": "standard"}` (one attempt, no hidden retries) so that Temporal's activity retry
policy is the only retry layer. Failures raise `StorageError` (retryable); a missing key
raises `ObjectNotFound` (non-retryable). The `*_bytes`/`list_keys`/`exists` methods are blocking;
async callers use `await store.put(...)` / `await store.get(...)` (thread-backed), as
`StoreCheckpointSink` does.

Edge cases: keys must be non-empty, relative, without `..` segments or a leading `/`
(ValueError). `list_keys(prefix)` is a plain string-prefix match, sorted, and returns
keys relative to the store prefix. LocalStore writes atomically (temp file + rename), so a
reader never sees a partial object.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar
from urllib.parse import unquote, urlparse

from trialflow.errors import ObjectExists, ObjectNotFound, StorageError
from workflows.shared import CHECKPOINTS_DIR, AttemptRecord  # the contract's types (re-exported here)

_T = TypeVar("_T")

if TYPE_CHECKING:
    from proxy.trajectory import Trajectory
    from trialflow.settings import TrialflowSettings


def validate_key(key: str) -> str:
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"invalid store key {key!r}: must be relative, without empty, '.' or '..' parts")
    return key


def trial_result_key(batch_id: str, trial_id: str) -> str:
    """The whole trial's result: beside its attempts (`TrialKeys.root` is one level down)."""
    return f"batches/{batch_id}/trials/{trial_id}/result.json"


def record_replay_key(batch_id: str, trial_id: str, name: str) -> str:
    """Where `trialflow replay TRIAL --from-record` keeps its report (``name``: attempt and
    time, so every re-run is kept); beside the trial's result, never named result.json."""
    return validate_key(f"batches/{batch_id}/trials/{trial_id}/replays/{name}.json")


def batch_skipped_key(batch_id: str) -> str:
    """The tasks `trialflow run --skip-invalid` left out of the batch, with their problems."""
    return f"batches/{batch_id}/skipped.json"


def trial_fence_key(batch_id: str, trial_id: str) -> str:
    """The trial's fence record (trialflow.fencing): beside its attempts, not inside one."""
    return f"batches/{batch_id}/trials/{trial_id}/fence.json"


_ATTEMPT_KEY = re.compile(r"^batches/([^/]+)/trials/([^/]+)/attempt-([0-9]+)/")


def attempt_of_key(key: str) -> tuple[str, str, int] | None:
    """(batch id, trial id, attempt) of a key inside an attempt's folder (`TrialKeys.root`,
    steps included); None for any other key."""
    match = _ATTEMPT_KEY.match(key)
    return (match[1], match[2], int(match[3])) if match else None


def host_registry_key(worker_id: str) -> str:
    """Where a worker host keeps its registration and lease (`trialflow.fencing.HostLease`)."""
    return validate_key(f"hosts/{worker_id}.json")


PROXY_REGISTRY_PREFIX = "proxies/"


def proxy_registry_key(worker_id: str) -> str:
    """Where a worker lists its proxy's management endpoint (`trialflow.policy_sync`)."""
    return validate_key(f"{PROXY_REGISTRY_PREFIX}{worker_id}.json")


# The version the trainer's last weight sync announced, for workers that start after it
# (`trialflow.policy_sync`).
POLICY_VERSION_KEY = "policy_version.json"


def checkpoint_key(prefix: str, seq: int) -> str:
    """The key of checkpoint ``seq`` under ``prefix`` (zero-padded: keys sort in turn order)."""
    return f"{prefix}/{seq:06d}.npz"


@dataclass(frozen=True)
class TrialKeys:
    """Keys of one trial attempt (see the module docstring)."""

    batch_id: str
    trial_id: str
    attempt: int
    # A multi-step task's step (`TaskStep.key`): its session, logs and artifacts live under
    # ``attempt-{n}/steps/{step}/`` with the same layout as an attempt's. None: single-step.
    step: str | None = None

    @property
    def root(self) -> str:
        root = f"batches/{self.batch_id}/trials/{self.trial_id}/attempt-{self.attempt}"
        return root if self.step is None else f"{root}/steps/{self.step}"

    @property
    def trajectory(self) -> str:
        return f"{self.root}/trajectory.npz"

    @property
    def checkpoints(self) -> str:
        """The checkpoint prefix (no trailing slash)."""
        return f"{self.root}/{CHECKPOINTS_DIR}"

    def checkpoint(self, seq: int) -> str:
        return checkpoint_key(self.checkpoints, seq)

    def log(self, name: str) -> str:
        return validate_key(f"{self.root}/logs/{name}")


class ResultStore(abc.ABC):
    """Blocking object store for trial artifacts."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Write (overwrite) `key`; return its URI."""

    @abc.abstractmethod
    def put_file(self, key: str, path: Path, content_type: str = "application/octet-stream") -> str:
        """Write (overwrite) `key` with the content of the local file `path`, streamed from
        disk (an artifact is never held whole in memory); return its URI."""

    @abc.abstractmethod
    def put_once(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """Write `key` only if it does not exist yet (atomically); return its URI. The same
        bytes again (a retried write) is a success; different bytes raise `ObjectExists`
        and leave the first write in place."""

    @abc.abstractmethod
    def get_bytes(self, uri_or_key: str) -> bytes:
        """Read an object. Raises ObjectNotFound."""

    @abc.abstractmethod
    def list_keys(self, prefix: str = "") -> list[str]:
        """Sorted keys starting with `prefix`."""

    @abc.abstractmethod
    def list_children(self, prefix: str) -> list[str]:
        """Sorted names one level below ``prefix`` (a folder, ending with ``/``): each object's
        or sub-folder's next key part, once. Lists that level only, not every key under it."""

    @abc.abstractmethod
    def exists(self, uri_or_key: str) -> bool: ...

    @abc.abstractmethod
    def delete(self, uri_or_key: str) -> None:
        """Remove an object; a missing one is not an error."""

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """URI of `key` (whether or not it exists)."""

    @abc.abstractmethod
    def key_of(self, uri_or_key: str) -> str:
        """The key of a URI of this store (a key is returned validated). ValueError for a
        URI of another store."""

    async def put(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        """`put_bytes` in a thread, for async callers."""
        return await asyncio.to_thread(self.put_bytes, key, data, content_type)

    async def get(self, uri_or_key: str) -> bytes:
        """`get_bytes` in a thread, for async callers."""
        return await asyncio.to_thread(self.get_bytes, uri_or_key)


def _staged(path: Path, data: bytes) -> str:
    """A temporary file beside ``path`` holding ``data``, for the caller to rename or link
    into place (so a reader never sees a partly written object)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return tmp


class LocalStore(ResultStore):
    """Objects as files under `root_dir` (the embedded fallback when no S3 is configured)."""

    def __init__(self, root_dir: str | os.PathLike[str]) -> None:
        self.root = Path(root_dir).resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def uri(self, key: str) -> str:
        return (self.root / validate_key(key)).as_uri()

    def key_of(self, uri_or_key: str) -> str:
        if uri_or_key.startswith("file://"):
            path = Path(unquote(urlparse(uri_or_key).path))
            if not path.is_relative_to(self.root):
                raise ValueError(f"{uri_or_key} is outside this store ({self.root})")
            return path.relative_to(self.root).as_posix()
        return validate_key(uri_or_key)

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        path = self.root / validate_key(key)
        try:
            os.replace(_staged(path, data), path)
        except OSError as e:
            raise StorageError(f"could not write {path}: {e}") from e
        return path.as_uri()

    def put_file(self, key: str, path: Path, content_type: str = "application/octet-stream") -> str:
        target = self.root / validate_key(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as out, path.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(tmp, target)
        except OSError as e:
            raise StorageError(f"could not write {target}: {e}") from e
        return target.as_uri()

    def put_once(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        path = self.root / validate_key(key)
        try:
            tmp = _staged(path, data)
            try:
                os.link(tmp, path)  # fails if `path` exists: the first write wins
            except FileExistsError:
                if path.read_bytes() != data:
                    raise ObjectExists(f"{key} was written before with other content") from None
            finally:
                os.unlink(tmp)
        except OSError as e:
            raise StorageError(f"could not write {path}: {e}") from e
        return path.as_uri()

    def get_bytes(self, uri_or_key: str) -> bytes:
        path = self.root / self.key_of(uri_or_key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise ObjectNotFound(f"no object {uri_or_key}") from None
        except OSError as e:
            raise StorageError(f"could not read {path}: {e}") from e

    def list_keys(self, prefix: str = "") -> list[str]:
        keys = []
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                if f.startswith(".tmp-"):
                    continue
                key = (Path(dirpath) / f).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def list_children(self, prefix: str) -> list[str]:
        folder = self.root / validate_key(prefix.rstrip("/")) if prefix.strip("/") else self.root
        try:
            return sorted(e.name for e in os.scandir(folder) if not e.name.startswith(".tmp-"))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise StorageError(f"could not list {folder}: {e}") from e

    def exists(self, uri_or_key: str) -> bool:
        return (self.root / self.key_of(uri_or_key)).is_file()

    def delete(self, uri_or_key: str) -> None:
        path = self.root / self.key_of(uri_or_key)
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            raise StorageError(f"could not delete {path}: {e}") from e


class S3Store(ResultStore):
    """Objects in an S3 bucket under `prefix` (SeaweedFS in development, any S3 in production).

    `create_bucket=True` creates the bucket when missing (development convenience).
    `ca_bundle`: the CA file to verify an HTTPS endpoint with (None: the system's roots).
    Credentials default to boto3's chain; SeaweedFS without auth accepts any key, so
    `access_key`/`secret_key` can be given explicitly for it.
    """

    def __init__(
        self,
        endpoint_url: str | None,
        bucket: str,
        prefix: str = "",
        *,
        region: str = "us-east-1",
        access_key: str | None = None,
        secret_key: str | None = None,
        create_bucket: bool = False,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
        ca_bundle: str | os.PathLike[str] | None = None,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._client = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key,
            aws_secret_access_key=secret_key,
            verify=str(ca_bundle) if ca_bundle is not None else None,  # None: boto3's default roots
            config=Config(
                retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=connect_timeout_s,
                read_timeout=read_timeout_s,
                s3={"addressing_style": "path"},
            ),
        )
        if create_bucket:
            self._ensure_bucket()

    def _ensure_bucket(self) -> None:
        """Create the bucket only when S3 says it does not exist: a refusal (wrong keys) is
        reported as that, not as a failed create."""
        try:
            self._guard(lambda: self._client.head_bucket(Bucket=self.bucket), f"bucket {self.bucket}")
        except ObjectNotFound:
            self._guard(
                lambda: self._client.create_bucket(Bucket=self.bucket), f"create bucket {self.bucket}"
            )

    def _full(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full(key)}"

    def key_of(self, uri_or_key: str) -> str:
        if not uri_or_key.startswith("s3://"):
            return validate_key(uri_or_key)
        parsed = urlparse(uri_or_key)
        full = parsed.path.lstrip("/")
        head = f"{self.prefix}/" if self.prefix else ""
        if parsed.netloc != self.bucket or not full.startswith(head):
            raise ValueError(f"{uri_or_key} is outside this store (s3://{self.bucket}/{head})")
        return full[len(head) :]

    def _guard(self, fn: Callable[[], _T], what: str) -> _T:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn()
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NotFound", "NoSuchBucket"):
                raise ObjectNotFound(f"no object for {what}") from None
            if code in _REFUSED:
                raise StorageError(
                    f"S3 at {self._client.meta.endpoint_url} refused the keys for {what} ({code}): "
                    "check TRIALFLOW_S3_ACCESS_KEY / TRIALFLOW_S3_SECRET_KEY"
                ) from None
            raise StorageError(f"S3 {what} failed: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"S3 {what} failed: {e}") from e

    def put_bytes(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        full = self._full(key)
        self._guard(
            lambda: self._client.put_object(
                Bucket=self.bucket, Key=full, Body=data, ContentType=content_type
            ),
            f"put {full}",
        )
        return f"s3://{self.bucket}/{full}"

    def put_file(self, key: str, path: Path, content_type: str = "application/octet-stream") -> str:
        full = self._full(key)

        def write() -> None:
            with path.open("rb") as body:  # botocore reads a file body in blocks
                self._client.put_object(Bucket=self.bucket, Key=full, Body=body, ContentType=content_type)

        self._guard(write, f"put {full}")
        return f"s3://{self.bucket}/{full}"

    def put_once(self, key: str, data: bytes, content_type: str = "application/octet-stream") -> str:
        from botocore.exceptions import ClientError

        full = self._full(key)

        def write() -> bool:
            try:  # a conditional write (If-None-Match: *); S3 and SeaweedFS answer 412
                self._client.put_object(
                    Bucket=self.bucket, Key=full, Body=data, ContentType=content_type, IfNoneMatch="*"
                )
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                    return False
                raise
            return True

        if not self._guard(write, f"put-once {full}") and self.get_bytes(key) != data:
            raise ObjectExists(f"{full} was written before with other content")
        return f"s3://{self.bucket}/{full}"

    def get_bytes(self, uri_or_key: str) -> bytes:
        full = self._full(self.key_of(uri_or_key))
        resp = self._guard(lambda: self._client.get_object(Bucket=self.bucket, Key=full), f"get {full}")
        return self._guard(lambda: resp["Body"].read(), f"read {full}")

    def list_keys(self, prefix: str = "") -> list[str]:
        head = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        token: str | None = None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": head + prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._guard(
                functools.partial(self._client.list_objects_v2, **kwargs), f"list {head + prefix}"
            )
            keys.extend(obj["Key"][len(head) :] for obj in page.get("Contents", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return sorted(keys)

    def list_children(self, prefix: str) -> list[str]:
        head = f"{self.prefix}/" if self.prefix else ""
        folder = head + (validate_key(prefix.rstrip("/")) + "/" if prefix.strip("/") else "")
        names: set[str] = set()
        token: str | None = None
        while True:  # Delimiter: S3 rolls each sub-folder up into one CommonPrefixes entry
            kwargs = {"Bucket": self.bucket, "Prefix": folder, "Delimiter": "/"}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._guard(functools.partial(self._client.list_objects_v2, **kwargs), f"list {folder}")
            names.update(obj["Key"][len(folder) :] for obj in page.get("Contents", []))
            names.update(p["Prefix"][len(folder) :].rstrip("/") for p in page.get("CommonPrefixes", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return sorted(n for n in names if n)

    def delete(self, uri_or_key: str) -> None:
        full = self._full(self.key_of(uri_or_key))
        self._guard(lambda: self._client.delete_object(Bucket=self.bucket, Key=full), f"delete {full}")

    def exists(self, uri_or_key: str) -> bool:
        full = self._full(self.key_of(uri_or_key))
        try:
            self._guard(lambda: self._client.head_object(Bucket=self.bucket, Key=full), f"head {full}")
        except ObjectNotFound:
            return False
        return True


# S3 error codes of a request the server refused for its credentials (HEAD answers a bare 403)
_REFUSED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"}


class StoreCheckpointSink:
    """`proxy.checkpoint.CheckpointSink` writing to `{key_prefix}/{seq:06d}.npz` in a store.

    `key_prefix` is usually `TrialKeys(...).checkpoints`. `session_id` is not part of the
    key: one sink serves one trial attempt. Writes run in a thread; errors propagate as
    `StorageError` to the session, which decides whether a failed checkpoint fails the turn.
    """

    def __init__(self, store: ResultStore, key_prefix: str) -> None:
        self.store = store
        self.key_prefix = validate_key(key_prefix.strip("/"))

    def key(self, seq: int) -> str:
        return checkpoint_key(self.key_prefix, seq)

    async def write(self, session_id: str, seq: int, payload: bytes) -> None:
        await asyncio.to_thread(self.store.put_bytes, self.key(seq), payload, "application/x-npz")


def open_store(settings: TrialflowSettings, *, create: bool = True) -> ResultStore:
    """The store the settings name: S3 when an endpoint is configured, else the local
    directory store (`store_dir`). The one place that maps settings to a store. ``create``
    False (readers such as the viewer): a missing bucket is not created, a missing directory
    raises ObjectNotFound instead of being made."""
    if settings.s3_endpoint:
        return S3Store(
            settings.s3_endpoint,
            settings.s3_bucket,
            settings.s3_prefix,
            access_key=settings.s3_access_key,
            secret_key=settings.s3_secret_key,
            create_bucket=create,
            ca_bundle=settings.s3_ca_bundle,
        )
    if not create and not Path(settings.store_dir).is_dir():
        raise ObjectNotFound(f"no store directory {settings.store_dir}")
    return LocalStore(settings.store_dir)


TrajectorySource = Literal["final", "checkpoints", "none"]


@dataclass(frozen=True)
class LoadedAttempt:
    """What `load_attempt` read. ``source``: "final" (the attempt's own trajectory),
    "checkpoints" (rebuilt from ``checkpoints`` per-turn deltas: the attempt was lost;
    ``partial`` is True) or "none" (no trajectory: a model-free scaffold, a crash before the
    first turn, or unreadable data, then ``error`` says why)."""

    record: AttemptRecord
    trajectory: Trajectory | None
    source: TrajectorySource
    checkpoints: int = 0
    error: str | None = None

    @property
    def partial(self) -> bool:
        return self.source == "checkpoints"


def load_attempt(store: ResultStore, record: AttemptRecord) -> LoadedAttempt:
    """Read one attempt's trajectory (see `LoadedAttempt`). Blocking; never raises for
    missing or corrupt data (that is ``error``), only for a record of another store
    (ValueError)."""
    from proxy.trajectory import Trajectory, TrajectoryError

    try:
        if record.trajectory_uri is not None:
            return LoadedAttempt(
                record, Trajectory.from_bytes(store.get_bytes(record.trajectory_uri)), "final"
            )
        if record.complete:
            return LoadedAttempt(record, None, "none")
        keys = store.list_keys(store.key_of(record.checkpoints_uri.rstrip("/")) + "/")
        if not keys:
            return LoadedAttempt(record, None, "none", error="lost before its first checkpoint")
        payloads = [store.get_bytes(k) for k in keys]
        return LoadedAttempt(record, Trajectory.from_checkpoints(payloads), "checkpoints", len(payloads))
    except (StorageError, TrajectoryError) as err:
        return LoadedAttempt(record, None, "none", error=f"{type(err).__name__}: {err}")


async def load_attempt_async(store: ResultStore, record: AttemptRecord) -> LoadedAttempt:
    """`load_attempt` in a thread."""
    return await asyncio.to_thread(load_attempt, store, record)
