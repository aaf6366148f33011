"""Each phase's network through real trials (Temporal dev server, Docker, SeaweedFS, the real
egress proxy): a verifier that installs its grading tool at verification time, as public
Harbor verifiers do (`curl ... | sh`, `uvx pytest`), from a package server the test runs.

- The server on loopback (127.0.0.2), reached through the egress proxy because the task
  lists it (`[verifier] network_mode = "allowlist"`).
- The server on a globally routable address (11.x, in a network namespace the test makes,
  joined to the host by a veth pair: nothing leaves the machine) for "public": the verifier
  of a task that states no network gets Harbor's default, public, and installs the tool.
  Under public a loopback server stays unreachable (the address rule).
- The agent phase's no-network default: the probe agent (a test scaffold) tries the same
  server in every trial and is refused; the run can widen it (`agent_default="public"`, or
  Harbor's extra hosts) or close the verifier (`verifier="no-network"`: the tool cannot be
  installed, reward 0; with extra hosts an allowlist of them again).
The trial result names each phase's effective mode and where it came from.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._worker_fixtures import worker_settings
from trialflow import batch
from trialflow.sandbox.base import ExecResult
from trialflow.scaffolds import Scaffold, ScaffoldContext, ScaffoldResult, register_scaffold
from workflows.shared import RunNetwork, TrialResult

pytestmark = [pytest.mark.temporal, pytest.mark.docker, pytest.mark.s3]

TOOL = "#!/bin/sh\necho graded by the installed tool\necho 1 > /logs/verifier/reward.txt\n"
PROBE_FILE = "/app/agent-probe.txt"
# A static file server that also takes the absolute-form request line a proxy forwards (RFC
# 9112 3.2.2: servers must; Python's http.server alone does not).
SERVER = r"""
import http.server, sys, urllib.parse
class Handler(http.server.SimpleHTTPRequestHandler):
    def translate_path(self, path):
        return super().translate_path(urllib.parse.urlsplit(path).path)
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Handler).serve_forever()
"""


class ProbeAgent(Scaffold):
    """Test scaffold: an agent that tries the package server from the agent phase (with the
    environment the phase gives it) and leaves what it saw for the verifier to report."""

    name = "test-net-probe"
    needs_model = False

    def __init__(self, url: str = "") -> None:
        self.url = url

    async def run(self, ctx: ScaffoldContext) -> ScaffoldResult:
        probe = (
            f"if curl -fsS --max-time 5 {self.url}/tool.sh >/dev/null 2>&1; "
            f"then echo reached; else echo refused; fi > {PROBE_FILE}"
        )
        res: ExecResult = await ctx.sandbox.exec(probe, env=ctx.env, timeout_s=60)
        return ScaffoldResult(res.exit_code, res.timed_out, res.stdout, res.stderr, res.duration_s)


register_scaffold("test-net-probe", f"{__name__}:ProbeAgent")


def _task(root: Path, url: str, network: str = "") -> Path:
    """A task whose test.sh installs its grader from `url` at verification time (nothing of
    it is in the image) and reports the agent's probe as a second reward."""
    files = {
        "task.toml": f'[environment]\nworkdir = "/app"\n{network}',
        "instruction.md": "Nothing to do.\n",
        "environment/Dockerfile": "FROM trialflow-base:bookworm\nWORKDIR /app\n",
        "tests/test.sh": (
            "#!/bin/bash\n"
            f'agent=$([ "$(cat {PROBE_FILE})" = reached ] && echo 1 || echo 0)\n'
            f"if curl -fsS --max-time 10 {url}/tool.sh -o /tmp/grade; then\n"
            "  sh /tmp/grade\n"
            '  echo "{\\"reward\\": 1, \\"agent_reached\\": $agent}" > /logs/verifier/reward.json\n'
            "else\n"
            "  echo 'could not install the grader' >&2\n"
            '  echo "{\\"reward\\": 0, \\"agent_reached\\": $agent}" > /logs/verifier/reward.json\n'
            "fi\n"
        ),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def package_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("packages")
    (root / "tool.sh").write_text(TOOL)
    return root


@pytest.fixture(scope="module")
def loopback_index(package_dir) -> Iterator[str]:
    port = _free_port("127.0.0.2")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, "127.0.0.2", str(port)],
        cwd=package_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_server("127.0.0.2", port, proc)
        yield f"http://127.0.0.2:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def global_index(package_dir) -> Iterator[str]:
    """The package server on a global address: a network namespace of the test's own, joined
    to this one by a veth pair on a /30 of 11.0.0.0/8 (globally routable; the host side's
    address is the worker's own, the far side's is not)."""
    tag = uuid.uuid4().hex[:6]
    ns, here, there = f"tfnet-{tag}", f"tfv{tag}a", f"tfv{tag}b"
    octet = int(tag[:2], 16)
    near, far = f"11.{octet}.{int(tag[2:4], 16)}.1", f"11.{octet}.{int(tag[2:4], 16)}.2"
    assert ipaddress.ip_address(far).is_global
    run = lambda *cmd: subprocess.run(cmd, check=True, capture_output=True)  # noqa: E731
    run("ip", "netns", "add", ns)
    proc = None
    try:
        run("ip", "link", "add", here, "type", "veth", "peer", "name", there, "netns", ns)
        run("ip", "addr", "add", f"{near}/30", "dev", here)
        run("ip", "link", "set", here, "up")
        run("ip", "-n", ns, "addr", "add", f"{far}/30", "dev", there)
        run("ip", "-n", ns, "link", "set", there, "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", SERVER, far, "8080"],
            cwd=package_dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for_server(far, 8080, proc)
        yield f"http://{far}:8080"
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes both veth ends


def _wait_for_server(host: str, port: int, proc: subprocess.Popen) -> None:
    """Until `proc` (a package server) accepts connections; it exiting is an error."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.05)
    raise AssertionError(f"package server on {host}:{port} did not start (exit {proc.poll()})")


@pytest.fixture(scope="module")
def settings(temporal_address, s3_endpoint, docker_client):
    return worker_settings("phase-net", temporal_address, s3_endpoint, docker_client, max_concurrent_trials=3)


async def _trials(client, settings, cases: dict[str, tuple[Path, str, RunNetwork]]) -> dict[str, TrialResult]:
    """One trial per case (the task dir's name is its label), all in one batch."""
    batch_id = f"net-{uuid.uuid4().hex[:6]}"
    specs = []
    for path, url, network in cases.values():
        specs += batch.make_specs(
            batch_id,
            [path],
            "test-net-probe",
            attempt_limit=1,
            scaffold_options={"url": url},
            network=network,
        )
    results = await batch.run(client, specs, task_queue=settings.task_queue)
    return {r.task_name: r for r in results}


async def test_the_verifier_installs_its_tool_the_agent_stays_offline(
    client, settings, worker, no_leaked_sandboxes, tmp_path, loopback_index, global_index
):
    allow = '[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["127.0.0.2"]\n'
    cases = {
        # the task lists the loopback index for its verifier
        "allowlist": (_task(tmp_path / "allowlist", loopback_index, allow), loopback_index, RunNetwork()),
        # the task says nothing: Harbor's default for the verifier, public
        "public": (_task(tmp_path / "public", global_index), global_index, RunNetwork()),
        # public keeps loopback (the worker's services) out of reach
        "public-loopback": (
            _task(tmp_path / "public-loopback", loopback_index),
            loopback_index,
            RunNetwork(),
        ),
        # the run closes the verifier's network: the tool cannot be installed
        "verifier-closed": (
            _task(tmp_path / "verifier-closed", global_index),
            global_index,
            RunNetwork(verifier="no-network"),
        ),
        # the run's extra hosts (Harbor's --allow-agent-host / --allow-verifier-host) widen a
        # closed phase into an allowlist of them
        "run-hosts": (
            _task(tmp_path / "run-hosts", loopback_index),
            loopback_index,
            RunNetwork(verifier="no-network", verifier_hosts=("127.0.0.2",), agent_hosts=("127.0.0.2",)),
        ),
        # the run gives the agent Harbor's default where the task states none
        "agent-public": (
            _task(tmp_path / "agent-public", global_index),
            global_index,
            RunNetwork(agent_default="public"),
        ),
    }
    results = await _trials(client, settings, cases)
    seen = {
        label: (r.rewards.get("reward"), r.rewards.get("agent_reached"), r.network_modes, r.network_origins)
        for label, r in results.items()
    }
    default = {"agent": "default", "verifier": "default"}
    assert seen == {
        "allowlist": (
            1.0,
            0.0,
            {"agent": "no-network", "verifier": "allowlist"},
            {"agent": "default", "verifier": "task"},
        ),
        "public": (1.0, 0.0, {"agent": "no-network", "verifier": "public"}, default),
        "public-loopback": (0.0, 0.0, {"agent": "no-network", "verifier": "public"}, default),
        "verifier-closed": (
            0.0,
            0.0,
            {"agent": "no-network", "verifier": "no-network"},
            {"agent": "default", "verifier": "run"},
        ),
        "agent-public": (1.0, 1.0, {"agent": "public", "verifier": "public"}, default),
        "run-hosts": (
            1.0,
            1.0,
            {"agent": "allowlist", "verifier": "allowlist"},
            {"agent": "run", "verifier": "run"},
        ),
    }, {k: (r.reward_error, r.error) for k, r in results.items()}
    assert all(r.reward_valid and r.error is None for r in results.values())
    assert results["public"].network_mode == "agent no-network, verifier public"
