"""The allowlist egress proxy against the real engine: from inside a no-network sandbox,
HTTP through the proxy reaches the allowed host (a local server on 127.0.0.2 standing in
for a package index) and nothing else; without the proxy nothing is reachable at all."""

import asyncio
import socket

import pytest
from aiohttp import web

from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox.egress import Egresses
from trialflow.sandbox.network import NetworkPolicy
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker

PROBE = r"""
import os, socket, sys, urllib.request
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return f"{r.status} {r.read().decode()}"
    except urllib.error.HTTPError as e:
        return f"{e.code}"
    except OSError as e:
        return f"error {type(e).__name__}"
def connect(target):
    port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    return s.recv(64).split(b"\r\n")[0].decode()
def direct(host, port):
    try:
        socket.create_connection((host, port), timeout=3); return "connected"
    except OSError as e:
        return f"error {type(e).__name__}"
allowed, other = sys.argv[1], sys.argv[2]
print("allowed:", get(f"http://{allowed}/simple/"))
print("other:", get(f"http://{other}/secret"))
print("connect-allowed:", connect(allowed))
print("connect-other:", connect(other))
print("direct-allowed:", direct(*allowed.split(":")))
"""


async def _index(host: str) -> tuple[web.AppRunner, int]:
    app = web.Application()

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=f"index on {host}")

    app.router.add_get("/{tail:.*}", page)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind((host, 0))
    site = web.SockSite(runner, sock)
    await site.start()
    return runner, sock.getsockname()[1]


async def test_allowlist_reaches_its_host_and_nothing_else(sandbox_for):
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    allowed_runner, allowed_port = await _index("127.0.0.2")
    other_runner, other_port = await _index("127.0.0.1")  # stands in for Temporal, S3, the proxy
    egresses = Egresses()
    try:
        env = await egresses.env_for(sb, NetworkPolicy("allowlist", ("127.0.0.2",)))
        assert env["http_proxy"].startswith("http://127.0.0.1:") and env["NO_PROXY"]
        res = await sb.exec(
            ["python3", "-c", PROBE, f"127.0.0.2:{allowed_port}", f"127.0.0.1:{other_port}"],
            env=env,
            timeout_s=60,
        )
        lines = dict(line.split(": ", 1) for line in res.stdout.splitlines())
        assert lines["allowed"] == "200 index on 127.0.0.2", res
        # no_proxy sends 127.0.0.1 direct, where the namespace has nothing: unreachable too.
        assert lines["other"].startswith("error"), res
        assert lines["connect-allowed"] == "HTTP/1.1 200 Connection Established"
        assert lines["connect-other"].startswith("HTTP/1.1 403")
        assert lines["direct-allowed"].startswith("error"), res
        decisions = egresses.decisions(sb.id)
        assert {(d.host, d.allowed) for d in decisions} == {("127.0.0.2", True), ("127.0.0.1", False)}
        # The verifier phase may say no-network: the same proxy then refuses everything.
        assert await egresses.env_for(sb, NetworkPolicy()) == {}
        res = await sb.exec(
            ["python3", "-c", PROBE, f"127.0.0.2:{allowed_port}", "x:1"], env=env, timeout_s=60
        )
        assert res.stdout.splitlines()[0] == "allowed: 403", res
    finally:
        await egresses.close(sb.id)
        assert len(egresses) == 0
        await allowed_runner.cleanup()
        await other_runner.cleanup()
    await asyncio.sleep(0)
