"""Pulling for real, from a registry on loopback: the Debian `docker-registry` (distribution
2.8, installed by infra/setup.sh) on a free 127.0.0.1 port, with htpasswd authentication
(so the engine's clients' credentials are what lets a pull through), holding images the tests
build from the local base and push. The engine trusts a 127.0.0.0/8 registry without TLS.

A task whose FROM (or COPY --from, or docker_image) names such an image, absent locally, is
pulled with the credentials `docker login` would have written ($DOCKER_CONFIG/config.json),
built, and solved by the oracle; without credentials the registry refuses (never retried);
an unknown image is refused, an unreachable registry is worth a retry, a pull past its
deadline is a build timeout; and the checks before submit ask the registry the same questions.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
import pytest

from tests.trialflow.test_tasks import make_task
from trialflow.errors import ImageBuildTimeout, ImagePullFailed, ImageUnavailable
from trialflow.sandbox import DockerBackend
from trialflow.sandbox.docker_pull import pull
from trialflow.sandbox.image_check import ImageChecker
from trialflow.sandbox.image_refs import ImagePolicy
from trialflow.scaffolds import ScaffoldContext, get_scaffold
from trialflow.tasks import load_task
from trialflow.verifier import run_verifier

pytestmark = pytest.mark.docker
ONLINE = ImagePolicy(offline=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bcrypt(password: str) -> str:
    with warnings.catch_warnings():  # crypt is deprecated; libxcrypt's bcrypt is what htpasswd needs
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT
    auth: dict[str, str]
    docker_config: Path  # a DOCKER_CONFIG directory whose config.json holds the login


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=2)
    except urllib.error.HTTPError as e:
        return e.code == 401  # up, and asking for credentials
    except OSError:
        return False
    return False


@pytest.fixture(scope="module")
def registry(tmp_path_factory, docker_client) -> Iterator[Registry]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry is not installed (infra/setup.sh installs it)")
    root = tmp_path_factory.mktemp("registry")
    user, password = "trialflow", uuid.uuid4().hex
    (root / "htpasswd").write_text(f"{user}:{_bcrypt(password)}\n")
    port = _free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: trialflow-test\n    path: {root / 'htpasswd'}\n"
    )
    log = open(root / "registry.log", "wb")  # noqa: SIM115 (closed at teardown)
    proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not _answers(f"http://127.0.0.1:{port}/v2/"):
            assert proc.poll() is None, (root / "registry.log").read_text()
            assert time.monotonic() < deadline, "the registry did not answer in 30 s"
            time.sleep(0.2)
        host = f"127.0.0.1:{port}"
        login = base64.b64encode(f"{user}:{password}".encode()).decode()
        config = root / "docker-config"
        config.mkdir()
        (config / "config.json").write_text(json.dumps({"auths": {host: {"auth": login}}}))
        yield Registry(host, {"username": user, "password": password}, config)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _client(docker_config: Path) -> docker.DockerClient:
    """A client of the test engine that reads its credentials from `docker_config` (the SDK
    loads them when it is made, from $DOCKER_CONFIG, as the docker CLI does)."""
    from infra import ensure_dockerd

    old = os.environ.get("DOCKER_CONFIG")
    os.environ["DOCKER_CONFIG"] = str(docker_config)
    try:
        return docker.DockerClient(base_url=ensure_dockerd().endpoint)
    finally:
        if old is None:
            del os.environ["DOCKER_CONFIG"]
        else:
            os.environ["DOCKER_CONFIG"] = old


@pytest.fixture
def pushed(registry, docker_client, base_image) -> Iterator:
    """push(name) -> (ref, marker): an image made here from the local base with a marker file
    of its own (so the pull downloads a layer), pushed, then removed from the engine."""
    made: list[str] = []

    def push(name: str) -> tuple[str, str]:
        marker = uuid.uuid4().hex
        ref = f"{registry.host}/trialflow-test/{name}:{marker[:12]}"
        dockerfile = f"FROM trialflow-base:bookworm\nRUN echo {marker} > /registry-marker\n".encode()
        docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=ref, network_mode="host", rm=True)
        repository, tag = ref.rsplit(":", 1)
        for chunk in docker_client.api.push(
            repository, tag, auth_config=registry.auth, stream=True, decode=True
        ):
            assert "error" not in chunk, chunk
        docker_client.images.remove(ref, force=True)  # absent locally: set-up must pull it
        made.append(ref)
        return ref, marker

    yield push
    for ref in made:
        with contextlib.suppress(docker.errors.ImageNotFound):
            docker_client.images.remove(ref, force=True)


@pytest.fixture
def online_backend(registry, docker_client) -> Iterator[DockerBackend]:
    be = DockerBackend(
        _client(registry.docker_config), labels={"trialflow.test_run": uuid.uuid4().hex}, images=ONLINE
    )
    yield be
    for c in docker_client.containers.list(
        all=True, filters={"label": [f"{k}={v}" for k, v in be.labels.items()]}
    ):
        c.remove(force=True)
    be.close()


def _oracle_task(root: Path, dockerfile: str | None, toml: str = 'version = "1.0"\n') -> Path:
    return make_task(
        root,
        toml,
        dockerfile=dockerfile,
        solve_sh="cat /registry-marker > /solved\n",
        test_sh="cmp -s /solved /registry-marker && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
    )


async def _oracle(backend: DockerBackend, root: Path):
    task = load_task(root)
    sb = await backend.create(task, trial_id=f"registry-{root.name}")
    try:
        await sb.start()
        marker = (await sb.exec("cat /registry-marker")).stdout.strip()
        result = await get_scaffold("oracle").run(ScaffoldContext(sandbox=sb, task=task, timeout_s=120))
        verdict = await run_verifier(sb, task)
    finally:
        await sb.stop()
    return task, marker, result, verdict


async def test_a_from_image_not_present_is_pulled_with_the_engines_credentials(
    tmp_path, registry, pushed, online_backend, docker_client, caplog
):
    ref, marker = pushed("base")
    caplog.set_level(logging.INFO, logger="trialflow.sandbox.docker_pull")
    task, seen, result, verdict = await _oracle(
        online_backend, _oracle_task(tmp_path / "from", f"FROM {ref}\n")
    )
    try:
        assert seen == marker  # the pulled layer, not a local look-alike
        assert result.exit_code == 0 and verdict.reward_valid and verdict.reward == 1.0, verdict.reason
        assert any(f"pulled {ref} in" in r.getMessage() for r in caplog.records)
        assert docker_client.images.get(ref).id  # the image is now on the engine under its name
        assert "trialflow.standins" not in docker_client.images.get(task.image_tag).labels
    finally:
        docker_client.images.remove(task.image_tag, force=True)


async def test_copy_from_and_docker_image_are_pulled_too(tmp_path, pushed, online_backend, docker_client):
    ref, marker = pushed("tool")
    copy = _oracle_task(
        tmp_path / "copy",
        f"FROM trialflow-base:bookworm\nCOPY --from={ref} /registry-marker /registry-marker\n",
    )
    task, seen, _, verdict = await _oracle(online_backend, copy)
    docker_client.images.remove(task.image_tag, force=True)
    assert seen == marker and verdict.reward == 1.0, verdict.reason
    prebuilt_ref, prebuilt_marker = pushed("prebuilt")
    prebuilt = _oracle_task(tmp_path / "pre", None, f'[environment]\ndocker_image = "{prebuilt_ref}"\n')
    _, seen, _, verdict = await _oracle(online_backend, prebuilt)
    assert seen == prebuilt_marker and verdict.reward == 1.0, verdict.reason


async def test_refusals_and_their_retry_rules(tmp_path, registry, pushed, docker_client):
    ref, _ = pushed("private")
    anonymous = _client(tmp_path / "no-login")  # a DOCKER_CONFIG without the registry's login
    with pytest.raises(ImageUnavailable, match="refused.*docker login") as refused:
        pull(anonymous, ref, deadline=time.monotonic() + 60, label="task t")
    assert not refused.value.retryable
    allowed = _client(registry.docker_config)
    with pytest.raises(ImageUnavailable, match="manifest unknown|not found") as unknown:
        pull(
            allowed, f"{registry.host}/trialflow-test/nope:1", deadline=time.monotonic() + 60, label="task t"
        )
    assert not unknown.value.retryable
    with pytest.raises(ImagePullFailed, match="connection refused") as cut:
        pull(
            allowed, f"127.0.0.1:{_free_port()}/trialflow-test/x:1", deadline=time.monotonic() + 60, label="t"
        )
    assert cut.value.retryable
    with pytest.raises(ImageBuildTimeout, match="ran out of time while pulling") as late:
        pull(allowed, ref, deadline=time.monotonic() - 1, label="task t")
    assert late.value.retryable
    lines: list[str] = []  # what the set-up heartbeat carries while it pulls
    pull(allowed, ref, deadline=time.monotonic() + 60, label="task t", on_progress=lines.append)
    assert lines[0] == f"pulling {ref}" and lines[-1] == f"pulled {ref}"


def test_before_submit_the_registry_is_asked(tmp_path, registry, pushed):
    ref, _ = pushed("asked")
    closed = f"127.0.0.1:{_free_port()}/trialflow-test/x:1"
    tasks = {
        "there": make_task(tmp_path / "there", dockerfile=f"FROM {ref}\n"),
        "unknown": make_task(
            tmp_path / "unknown", dockerfile=f"FROM {registry.host}/trialflow-test/nope:1\n"
        ),
        "unreachable": make_task(
            tmp_path / "unreachable", dockerfile=f"FROM trialflow-base:bookworm\nCOPY --from={closed} /a /a\n"
        ),
    }
    checker = ImageChecker(_client(registry.docker_config), ONLINE)
    found = {name: checker.problems(load_task(path)) for name, path in tasks.items()}
    assert found["there"] == []
    [unknown] = found["unknown"]
    assert unknown.startswith("environment/Dockerfile line 1: FROM ") and "the registry refuses it" in unknown
    [unreachable] = found["unreachable"]
    assert unreachable.startswith(
        f"environment/Dockerfile line 2: COPY --from {closed}: its registry cannot be reached"
    )
    assert "TRIALFLOW_IMAGES_OFFLINE=1" in unreachable
