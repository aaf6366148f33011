"""Allowlisted names are checked by address too (issue 20, 6), through the real egress
proxy from inside a real no-network sandbox: the worker's hostname (`vm` here) and
`localhost` resolve to 127.0.0.1, where the worker's services listen (SeaweedFS, Temporal);
listing the name must not reach them, by CONNECT or by an absolute-form request. An
address the task lists itself still does (the documented way to allow one)."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from tests.integrity._support import text_service
from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox.egress import Egresses, own_address
from trialflow.sandbox.network import NetworkPolicy
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker

PROBE = r"""
import os, socket, sys
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
def ask(line):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(line.encode())
    return s.recv(200).split(b"\r\n")[0].decode()
for target in sys.argv[1:]:
    print("CONNECT", target, "->", ask(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"))
    print("GET", target, "->", ask(f"GET http://{target}/ HTTP/1.1\r\nHost: {target}\r\n\r\n"))
"""


async def test_listed_names_resolving_to_the_worker_reach_nothing(sandbox_for):
    hostname = socket.gethostname()
    resolved = {info[4][0] for info in socket.getaddrinfo(hostname, 80, type=socket.SOCK_STREAM)}
    names = ["localhost"] + (
        [hostname] if not any(ipaddress.ip_address(a).is_global for a in resolved) else []
    )
    sb = await sandbox_for(load_task(EXAMPLES / "create-file"))
    service, port = await text_service("127.0.0.1", "worker service")  # stands in for SeaweedFS / Temporal
    listed, listed_port = await text_service("127.0.0.2", "worker service")
    egresses = Egresses()
    try:
        policy = NetworkPolicy("allowlist", (*names, "*.localhost", "127.0.0.2"))
        env = await egresses.env_for(sb, policy)
        targets = [f"{name}:{port}" for name in names] + [f"127.0.0.2:{listed_port}"]
        res = await sb.exec(["python3", "-c", PROBE, *targets], env=env, timeout_s=60)
        answers = dict(line.rsplit(" -> ", 1) for line in res.stdout.splitlines())
        for name in names:
            assert answers[f"CONNECT {name}:{port}"] == "HTTP/1.1 403 Forbidden", res
            assert answers[f"GET {name}:{port}"] == "HTTP/1.1 403 Forbidden", res
        assert answers[f"CONNECT 127.0.0.2:{listed_port}"] == "HTTP/1.1 200 Connection Established", res
        assert answers[f"GET 127.0.0.2:{listed_port}"] == "HTTP/1.1 200 OK", res
        refused = [d for d in egresses.decisions(sb.id) if not d.allowed]
        assert {d.host for d in refused} == set(names) and all("127.0.0.1" in d.reason for d in refused)
    finally:
        await egresses.close(sb.id)
        await service.cleanup()
        await listed.cleanup()


def test_the_workers_own_addresses_are_known_to_the_kernel():
    assert own_address(ipaddress.ip_address("127.0.0.1")) and own_address(ipaddress.ip_address("::1"))
    assert not own_address(ipaddress.ip_address("198.51.100.77"))  # TEST-NET-2: on no interface here
