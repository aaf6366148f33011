"""Compose environments as pods on the real engine (trialflow.sandbox.pod): services in the
sandbox's own network namespace, reachable by name, started in depends_on order behind
their healthchecks, hardened like the sandbox, gone with it; and the pure parts (the
gate on an engine state, a service's create options).

Tasks are written here (tmp dirs) FROM the local `trialflow-base:bookworm`; every service
builds from one shared context (`svc/`: the base image and nothing else, so its image is
built once) and gets its program from the compose file; plus the sample task
examples/tasks/compose-services."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from tests.trialflow.conftest import EXAMPLES
from trialflow.compose import ComposeService, Condition, ServiceHealthcheck
from trialflow.errors import ServiceFailed, ServiceStartTimeout, ServiceUnhealthy
from trialflow.sandbox.docker import docker_create_options
from trialflow.sandbox.egress import Egresses
from trialflow.sandbox.network import NetworkPolicy
from trialflow.sandbox.pod import gate, service_options
from trialflow.sandbox.policy import SandboxPolicy
from trialflow.sandbox.reaper import LABEL_POD_OF, LABEL_POD_ROLE, LABEL_TRIAL_ID
from trialflow.tasks import load_task
from trialflow.verifier import run_verifier

HTTP = "python3 -m http.server --bind 0.0.0.0"
PORT_UP = "import socket,sys; socket.create_connection(('localhost', int(sys.argv[1])), timeout=2).close()"


def _task(root: Path, compose: str) -> Path:
    files = {
        "task.toml": '[environment]\nworkdir = "/app"\n',
        "instruction.md": "Use the services.\n",
        "environment/Dockerfile": "FROM trialflow-base:bookworm\nRUN mkdir -p /app\n",
        "environment/svc/Dockerfile": "FROM trialflow-base:bookworm\n",
        "environment/docker-compose.yaml": compose,
        "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _started_at(state: dict) -> datetime:
    return datetime.fromisoformat(state["StartedAt"][:26].rstrip("Z"))


def _host_addresses() -> set[str]:
    """The host's IPv4 addresses (loopback and every interface's)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[3].split("/")[0] for line in out.splitlines()}


# -- pure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "state", "met"),
    [
        (Condition.STARTED, {"Status": "created"}, False),
        (Condition.STARTED, {"Status": "running"}, True),
        (Condition.STARTED, {"Status": "restarting"}, False),
        (Condition.HEALTHY, {"Status": "running", "Health": {"Status": "starting"}}, False),
        (Condition.HEALTHY, {"Status": "running", "Health": {"Status": "healthy"}}, True),
        (Condition.COMPLETED, {"Status": "running"}, False),
        (Condition.COMPLETED, {"Status": "exited", "ExitCode": 0}, True),
    ],
)
def test_gate(condition, state, met):
    assert gate("svc", condition, state) is met


@pytest.mark.parametrize(
    ("condition", "state", "error", "match"),
    [
        (Condition.STARTED, {"Status": "exited", "ExitCode": 3}, ServiceFailed, "exited with code 3"),
        (Condition.COMPLETED, {"Status": "exited", "ExitCode": 1}, ServiceFailed, "code 1.*succeed"),
        (Condition.HEALTHY, {"Status": "running"}, ServiceFailed, "no healthcheck"),
        (
            Condition.HEALTHY,
            {
                "Status": "running",
                "Health": {
                    "Status": "unhealthy",
                    "FailingStreak": 3,
                    "Log": [{"ExitCode": 7, "Output": "db down\n"}],
                },
            },
            ServiceUnhealthy,
            r"failed 3 times in a row \(last exit code 7, output: db down\)",
        ),
    ],
)
def test_gate_failures_are_typed(condition, state, error, match):
    with pytest.raises(error, match=match):
        gate("svc", condition, state)


def test_service_options_keep_the_sandbox_hardening_and_the_task_limits():
    policy = SandboxPolicy()
    svc = ComposeService(
        name="db",
        image="img",
        labels={"trialflow.managed": "false", "team": "x"},
        cap_drop=("CHOWN",),
        pids_limit=4096,
        mem_limit=4 << 30,
        cpus=0.25,
        entrypoint=(),
        healthcheck=ServiceHealthcheck(test=("CMD", "true"), interval_s=2, retries=5),
        restart="on-failure:2",
    )
    opts = service_options(
        svc,
        name="tf-x-db",
        image="img",
        holder_id="h1",
        labels={"trialflow.managed": "true", LABEL_POD_OF: "tf-x"},
        hardening=docker_create_options(policy, workdir=None, storage_mb=None),
        cpus=1.0,
        memory_mb=512,
    )
    assert opts["network_mode"] == "container:h1"
    assert opts["labels"]["trialflow.managed"] == "true" and opts["labels"]["team"] == "x"
    assert opts["labels"][LABEL_POD_ROLE] == "service"
    assert opts["pids_limit"] == 1024  # the policy's, not the service's larger one
    assert opts["mem_limit"] == 512 << 20 and opts["nano_cpus"] == 250_000_000  # the smaller of each
    assert set(policy.cap_drop) | {"CHOWN"} == set(opts["cap_drop"])
    assert "no-new-privileges:true" in opts["security_opt"]
    assert any(o.startswith("seccomp=") for o in opts["security_opt"])
    assert opts["entrypoint"] == [""]  # Compose's `entrypoint: []` clears the image's
    assert opts["healthcheck"] == {"test": ["CMD", "true"], "interval": 2_000_000_000, "retries": 5}
    assert opts["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 2}
    assert "privileged" not in opts and "cap_add" not in opts


# -- real engine ---------------------------------------------------------------------------


@pytest.mark.docker
async def test_sample_task_services_by_name_in_order_and_through_verification(
    sandbox_for, backend, docker_client
):
    """examples/tasks/compose-services: kv (2 s warm-up) -> api-server (reads kv at start)
    -> main. The oracle's solve.sh talks to api-server by name; test.sh, after the
    verification restart, still reaches the live service and finds the item there."""
    task = load_task(EXAMPLES / "compose-services")
    sb = await sandbox_for(task)
    api = docker_client.api
    pod = {
        c["Labels"]["trialflow.service"]: api.inspect_container(c["Id"])["State"]
        for c in api.containers(
            all=True, filters={"label": [f"{LABEL_POD_OF}={sb.id}", f"{LABEL_POD_ROLE}=service"]}
        )
    }
    main = api.inspect_container(sb.container_id)["State"]
    # api-server waited for kv's healthcheck (kv warms up 2 s), main for api-server's
    assert (_started_at(pod["api-server"]) - _started_at(pod["kv"])).total_seconds() >= 2.0
    assert _started_at(main) > _started_at(pod["api-server"])
    assert pod["api-server"]["Health"]["Status"] == pod["kv"]["Health"]["Status"] == "healthy"
    hosts = await sb.exec(
        "grep -E '[[:space:]](main|kv|api-server)$' /etc/hosts; cat /proc/net/dev | tail -n +3 | cut -d: -f1"
    )
    assert hosts.stdout.split() == ["127.0.0.1", "api-server", "127.0.0.1", "kv", "127.0.0.1", "main", "lo"]
    await sb.upload(task.solution_dir, "/solution")
    solved = await sb.exec(["bash", "/solution/solve.sh"], timeout_s=60)
    assert solved.ok, solved
    result = await run_verifier(sb, task, timeout_s=60)
    assert result.rewards == {"reward": 1.0}, result.stdout + result.stderr
    assert "harbor" in result.stdout  # what the live API held during verification
    # found again by id (later activities), the services' names still go direct, not
    # through a phase's egress proxy (which could not resolve them)
    again = await backend.attach(sb.id)
    assert again.local_names == ("main", "api-server", "kv")
    egresses = Egresses()
    try:
        env = await egresses.env_for(again, NetworkPolicy("public"))
        assert env["NO_PROXY"] == "127.0.0.1,localhost,main,api-server,kv"
        via = await again.exec("curl -fsS http://api-server:5000/items", env=env, timeout_s=30)
        assert via.ok and "harbor" in via.stdout, via
    finally:
        await egresses.close(again.id)


@pytest.mark.docker
async def test_a_failing_healthcheck_is_a_typed_error_with_its_output(tmp_path, backend, docker_client):
    task = load_task(
        _task(
            tmp_path / "t",
            """
services:
  main: {depends_on: {db: {condition: service_healthy}}}
  db:
    build: ./svc
    command: sleep infinity
    healthcheck: {test: "echo db-not-ready >&2; exit 4", interval: 500ms, timeout: 2s, retries: 2}
""",
        )
    )
    sb = await backend.create(task, trial_id="test-unhealthy")
    try:
        with pytest.raises(ServiceUnhealthy, match=r"service db is unhealthy.*exit code 4.*db-not-ready"):
            await sb.start()
        assert not await sb.is_running()  # main never started: the agent never ran
    finally:
        await sb.stop()
    left = docker_client.containers.list(all=True, filters={"label": f"{LABEL_TRIAL_ID}=test-unhealthy"})
    assert left == []


@pytest.mark.docker
async def test_exited_services_and_completed_dependencies(tmp_path, backend):
    ok = load_task(
        _task(
            tmp_path / "ok",
            """
services:
  main: {depends_on: [web]}
  seed: {build: ./svc, command: ["sh", "-c", "echo seeded > /tmp/s; exit 0"]}
  web:
    build: ./svc
    command: HTTP 8080
    depends_on: {seed: {condition: service_completed_successfully}}
""".replace("HTTP", HTTP),
        )
    )
    sb = await backend.create(ok, trial_id="test-completed")
    try:
        await sb.start()  # seed exited 0 and something waited for exactly that: fine
        assert (await sb.exec("curl -fsS -o /dev/null -w '%{http_code}' http://web:8080/")).stdout == "200"
    finally:
        await sb.stop()
    crash = load_task(
        _task(
            tmp_path / "crash",
            "services:\n  main: {depends_on: [job]}\n  job: {build: ./svc, command: 'sh -c \"exit 3\"'}\n",
        )
    )
    sb = await backend.create(crash, trial_id="test-crash")
    try:
        with pytest.raises(ServiceFailed, match="service job exited with code 3"):
            await sb.start()
    finally:
        await sb.stop()


@pytest.mark.docker
async def test_services_not_ready_in_time_are_a_retryable_timeout(tmp_path, make_backend):
    backend = make_backend(compose_start_timeout_s=2)
    task = load_task(
        _task(
            tmp_path / "t",
            """
services:
  main: {depends_on: {slow: {condition: service_healthy}}}
  slow: {build: ./svc, command: sleep infinity, healthcheck: {test: "exit 1", interval: 1s, start_period: 1m}}
""",
        )
    )
    sb = await backend.create(task, trial_id="test-slow")
    try:
        with pytest.raises(
            ServiceStartTimeout, match=r"main waits for service slow \(service_healthy\)"
        ) as exc:
            await sb.start()
        assert exc.value.retryable
    finally:
        await sb.stop()


RELAY = r"""
import http.server, socket, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        host, port = self.path.strip("/").split(":")
        try:
            socket.create_connection((host, int(port)), timeout=3).close(); out = b"connected"
        except OSError as e:
            out = type(e).__name__.encode() + b" " + str(e.errno).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(out)
http.server.HTTPServer(("0.0.0.0", 7000), H).serve_forever()
"""


@pytest.mark.docker
async def test_services_cannot_take_the_agent_beyond_the_sandbox(tmp_path, sandbox_for, docker_client):
    """A service is no way out: it shares the sandbox's loopback-only namespace. The agent
    asks a relay service to connect to a listener on the host, by the host's loopback
    and by its other addresses; nothing arrives, and the service has no interface but lo."""
    root = _task(
        tmp_path / "t",
        """
services:
  main: {depends_on: {relay: {condition: service_healthy}}}
  relay:
    build: ./svc
    command: ["python3", "/relay.py"]
    volumes: ["./relay.py:/relay.py:ro"]
    healthcheck: {test: ["CMD", "python3", "-c", "PORT_UP", "7000"], interval: 500ms, retries: 20}
""".replace("PORT_UP", PORT_UP),
    )
    (root / "environment" / "relay.py").write_text(RELAY)
    sb = await sandbox_for(load_task(root))
    host = socket.create_server(("0.0.0.0", 0))
    host.setblocking(False)
    port = host.getsockname()[1]
    addresses = _host_addresses()
    assert "127.0.0.1" in addresses and len(addresses) >= 2
    try:
        for address in sorted(addresses):
            via_relay = await sb.exec(f"curl -sS http://relay:7000/{address}:{port}", timeout_s=30)
            assert via_relay.ok and via_relay.stdout and via_relay.stdout != "connected", via_relay
            direct = await sb.exec(f"curl -sS -m 3 http://{address}:{port}/", timeout_s=30)
            assert not direct.ok
        await asyncio.sleep(0.2)
        with pytest.raises(BlockingIOError):
            host.accept()  # nothing ever connected
    finally:
        host.close()
    (relay_c,) = docker_client.containers.list(
        filters={"label": [f"{LABEL_POD_OF}={sb.id}", "trialflow.service=relay"]}
    )
    dev = relay_c.exec_run("cat /proc/net/dev").output.decode().splitlines()[2:]  # past the 2 header lines
    assert [line.split(":")[0].strip() for line in dev] == ["lo"]
    seen = await sb.exec("ps -eo args")
    assert "relay.py" not in seen.stdout  # the agent sees none of the services' processes


@pytest.mark.docker
async def test_services_are_hardened_like_the_sandbox(tmp_path, sandbox_for, docker_client):
    sb = await sandbox_for(
        load_task(
            _task(
                tmp_path / "t",
                "services:\n  web:\n    build: ./svc\n    command: HTTP 80\n".replace("HTTP", HTTP),
            )
        )
    )
    api = docker_client.api
    main = api.inspect_container(sb.container_id)["HostConfig"]
    members = {
        c["Labels"][LABEL_POD_ROLE]: api.inspect_container(c["Id"])
        for c in api.containers(filters={"label": f"{LABEL_POD_OF}={sb.id}"})
    }
    holder, web = members["holder"], members["service"]
    assert main["NetworkMode"] == web["HostConfig"]["NetworkMode"] == f"container:{holder['Id']}"
    assert holder["HostConfig"]["NetworkMode"] == "none"
    for hc in (main, web["HostConfig"], holder["HostConfig"]):
        assert not hc["Privileged"] and not hc["CapAdd"]
        assert "no-new-privileges:true" in hc["SecurityOpt"]
        assert any(o.startswith("seccomp=") for o in hc["SecurityOpt"])
        assert 0 < hc["PidsLimit"] <= 1024
    assert set(SandboxPolicy().cap_drop) <= set(web["HostConfig"]["CapDrop"])
    assert holder["HostConfig"]["CapDrop"] == ["ALL"] and holder["HostConfig"]["ReadonlyRootfs"]


@pytest.mark.docker
async def test_teardown_and_the_reaper_remove_every_container_of_a_pod(tmp_path, backend, docker_client):
    task = load_task(
        _task(
            tmp_path / "t",
            "services:\n  a: {build: ./svc, command: sleep infinity}\n  b: {build: ./svc, command: sleep infinity}\n",
        )
    )
    sb = await backend.create(task, trial_id="test-teardown")
    await sb.start()
    scope = {"label": f"{LABEL_TRIAL_ID}=test-teardown"}
    assert len(docker_client.containers.list(all=True, filters=scope)) == 4  # main, holder, a, b
    await sb.stop()
    assert docker_client.containers.list(all=True, filters=scope) == []
    leaked = await backend.create(task, trial_id="test-leaked")  # a dead worker's pod
    await leaked.start()
    report = await backend.reap(older_than_s=0)
    assert len(report.removed) == 4 and not report.failed
    assert docker_client.containers.list(all=True, filters={"label": f"{LABEL_TRIAL_ID}=test-leaked"}) == []


@pytest.mark.docker
def test_service_images_are_checked_before_submitting(tmp_path, docker_client):
    """What `run` checks before it submits covers the services' images too, offline: the
    public mcp-tools shape (`COPY --from=ghcr.io/astral-sh/uv:latest` in a service's
    Dockerfile) and an absent `image:` are listed with their file and line; a service on
    main's own image (`${MAIN_IMAGE_NAME}`, built with the task) is not a problem."""
    from trialflow.preflight import check_batch
    from trialflow.sandbox.image_check import ImageChecker
    from trialflow.sandbox.image_refs import ImagePolicy

    root = _task(
        tmp_path / "t",
        """
services:
  mcp-server: {build: ./mcp-server}
  cache: {image: "redis:7.4-alpine"}
  twin: {image: "${MAIN_IMAGE_NAME}", command: sleep infinity}
""",
    )
    (root / "environment" / "mcp-server").mkdir()
    (root / "environment" / "mcp-server" / "Dockerfile").write_text(
        "FROM python:3.12-slim\nCOPY --from=ghcr.io/astral-sh/uv:latest /uv /uvx /bin/\n"
    )
    (root / "solution").mkdir()
    (root / "solution" / "solve.sh").write_text("true\n")
    check = check_batch(
        [root], "oracle", samples=1, images=ImageChecker(docker_client, ImagePolicy(offline=True))
    )
    assert sorted(check.tasks[root]) == [
        f"{root}: docker_image redis:7.4-alpine is not present locally, images are not pulled (images_offline), "
        "and trialflow has no stand-in for it (docs/harbor.md lists them)",
        f"{root}: environment/mcp-server/Dockerfile line 2: COPY --from ghcr.io/astral-sh/uv:latest is not present "
        "locally, images are not pulled (images_offline), and trialflow has no stand-in for it (docs/harbor.md lists them)",
    ]
