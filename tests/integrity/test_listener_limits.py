"""Floods of a sandbox's listeners (issue 20, 5), through the REAL listeners served into
REAL sandboxes: the egress proxy (allowlist mode) and the proxy session listener.

Before: two processes in one sandbox held 21,000 egress connections (the worker ran out of
file descriptors; a bystander trial took 44 s instead of 9), and 60 queued 7.4 MiB bodies
took the proxy from 435 MB to 1.4 GB. Asserted now: the egress proxy holds at most its cap
(past it, accepting pauses: the rest wait in the kernel's backlog); the session listener
answers clear refusals (503 for a connection over its cap, 429 in the protocol's error
shape for a request over the session's limits, never a 500); silent connections are closed
by the header timeout; the
worker's descriptors and memory stay bounded; a bystander sandbox's requests keep their
latency (p50 as a ratio to an idle run in the same test, loose bound for a loaded 2-core
machine); nothing is left open afterwards.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
import statistics

import pytest

from tests.integrity._floods import BODY_FLOOD, CHAT_PROBE, FLOOD, PROBE
from tests.integrity._support import fd_count, peaks, text_service
from tests.trialflow.conftest import EXAMPLES
from trialflow.sandbox.egress import Egresses, EgressLimits
from trialflow.sandbox.network import NetworkPolicy
from trialflow.tasks import load_task

pytestmark = pytest.mark.docker


async def _p50(sandbox, env, url: str, n: int = 30) -> float:
    res = await sandbox.exec(["python3", "-c", PROBE, url, str(n)], env=env, timeout_s=120)
    assert res.ok, res
    return statistics.median(json.loads(res.stdout))


async def test_an_egress_flood_is_capped_and_the_neighbour_keeps_its_latency(sandbox_for):
    task = load_task(EXAMPLES / "create-file")
    flooder, bystander = await sandbox_for(task), await sandbox_for(task)
    upstream, port = await text_service("127.0.0.2", "package index")
    cap = 32
    egresses = Egresses(EgressLimits(max_connections=cap, header_timeout_s=2.0, idle_timeout_s=60.0))
    policy = NetworkPolicy("allowlist", ("127.0.0.2",))
    try:
        flood_env = await egresses.env_for(flooder, policy)
        env = await egresses.env_for(bystander, policy)
        url = f"http://127.0.0.2:{port}/simple/"
        idle = await _p50(bystander, env, url)
        baseline = fd_count()
        egress_port = flood_env["http_proxy"].rsplit(":", 1)[1]
        target = f"127.0.0.2:{port}"
        script = " & ".join(
            f"python3 -c {shlex.quote(FLOOD)} {kind} {egress_port} {target} 8"
            for kind in ("tunnel", "silent")
        )
        async with peaks() as seen:
            flood = asyncio.create_task(flooder.exec(["bash", "-c", script + " & wait"], timeout_s=120))
            await asyncio.sleep(1.5)  # the flood is under way
            during = await _p50(bystander, env, url)
            res = await flood
        stats = {s["kind"]: s for s in map(json.loads, res.stdout.splitlines())}
        assert set(stats) == {"tunnel", "silent"}, res
        # Past the cap the egress proxy stops accepting: the rest wait in the kernel's backlog
        # (and time out at the flooder) instead of costing the worker a refusal each.
        assert stats["tunnel"]["kept"] <= cap and stats["tunnel"]["refused"] == 0, stats
        assert stats["tunnel"]["errors"] > 0, stats  # connects or answers that timed out waiting
        assert stats["silent"]["closed_by_server"] > 0, stats  # the header timeout frees slots
        # A held tunnel costs the worker two descriptors (sandbox side, upstream side), here
        # three (the upstream server runs in this process too); a silent connection one.
        assert seen.fd_growth <= 3 * cap + 16, seen
        assert during <= 3 * idle + 0.01, (idle, during)
        print(
            f"egress flood: bystander p50 idle {idle * 1000:.2f} ms, during {during * 1000:.2f} ms; {stats}"
        )
    finally:
        await egresses.close(flooder.id)
        await egresses.close(bystander.id)
        await upstream.cleanup()
    await asyncio.sleep(0.2)
    assert fd_count() <= baseline + 2, (baseline, fd_count())


async def test_a_session_listener_flood_is_refused_in_the_protocol_shape(sandbox_for, tiny_model_dir):
    from transformers import AutoTokenizer

    from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
    from tests.proxy._support import proxy_server

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    task = load_task(EXAMPLES / "create-file")
    flooder, bystander = await sandbox_for(task), await sandbox_for(task)
    async with ScriptedVLLM(tok, default=Reply("ok")) as dbl, proxy_server(tok, dbl.url) as srv:
        flood_session, quiet_session = srv.open_session(), srv.open_session()
        flood_base = await srv.serve_session(flood_session.session_id, await flooder.listen_loopback())
        base = await srv.serve_session(quiet_session.session_id, await bystander.listen_loopback())

        async def p50() -> float:
            res = await bystander.exec(["python3", "-c", CHAT_PROBE, base, "20"], timeout_s=120)
            assert res.ok, res
            return statistics.median(json.loads(res.stdout))

        idle = await p50()
        baseline = fd_count()
        size = int(7.4 * (1 << 20))
        async with peaks() as seen:
            flood = asyncio.create_task(
                flooder.exec(["python3", "-c", BODY_FLOOD, flood_base, "60", str(size), "6"], timeout_s=300)
            )
            await asyncio.sleep(0.5)  # the first round is under way
            during = await p50()
            assert not flood.done(), "the flood ended before the bystander's requests"
            res = await flood
        report = json.loads(res.stdout)
        outcomes = report["outcomes"]
        print(
            f"session flood: bystander p50 idle {idle * 1000:.2f} ms, during {during * 1000:.2f} ms; "
            f"proxy RSS +{seen.rss_growth_mib:.0f} MiB, fds +{seen.fd_growth}; {report}"
        )
        assert res.ok and "500" not in outcomes, report
        assert outcomes.get("429", 0) >= 40, report  # 32 MiB of bodies in flight: four at a time
        assert [429, "error", "rate_limit_error"] in report["shapes"], report  # Anthropic's error shape
        assert seen.rss_growth_mib < 300, seen  # was +1 GB
        assert during <= 3 * idle + 0.01, (idle, during)
        assert srv.session_stats(quiet_session.session_id).turns == 40
        await srv.close_session(flood_session.session_id)
        await srv.close_session(quiet_session.session_id)
    await asyncio.sleep(0.2)
    assert fd_count() <= baseline + 2, (baseline, fd_count())


def test_request_gate_rules():
    from proxy.errors import TooManyRequests
    from proxy.limits import RequestGate

    gate = RequestGate(max_requests=2, max_queued_bytes=100)
    with gate.admit(60):
        with pytest.raises(TooManyRequests, match="body bytes"):
            with gate.admit(41):
                pass
        with gate.admit(40):
            with pytest.raises(TooManyRequests, match="2 requests"):
                with gate.admit(0):
                    pass
    assert (gate.requests, gate.queued_bytes) == (0, 0)


async def test_a_session_listener_over_its_connection_cap_answers_503(tiny_model_dir):
    """The connection over the cap is answered at once (503, an error object both SDKs
    read) and closed; once one closes, a new connection is served again."""
    from transformers import AutoTokenizer

    from tests.doubles.scripted_vllm import ScriptedVLLM
    from tests.proxy._support import proxy_server

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        srv.session_max_connections = 4
        handle = srv.open_session()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        base = await srv.serve_session(handle.session_id, sock)
        host, port = base.removeprefix("http://").split(":")
        held = [await asyncio.open_connection(host, int(port)) for _ in range(4)]
        reader, writer = await asyncio.open_connection(host, int(port))
        answer = await asyncio.wait_for(reader.read(), 5)
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 503 ") and json.loads(body)["error"]["type"] == "overloaded_error"
        writer.close()
        held.pop()[1].close()
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200 ")
        writer.close()
        for _, w in held:
            w.close()
        await srv.close_session(handle.session_id)


async def test_an_idle_tunnel_is_closed_and_a_busy_one_is_not():
    """The egress proxy's idle timeout counts bytes either way: a tunnel where only the
    upstream talks stays open; one where nothing moves is closed (its two descriptors
    freed). A real EgressProxy on a host listener (the sandbox side needs no engine here)."""
    from trialflow.sandbox.egress import EgressProxy

    async def ticker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = await reader.read(1)
        while first == b"t":  # "t": the upstream talks every 0.1 s; anything else: silence
            writer.write(b".")
            await writer.drain()
            await asyncio.sleep(0.1)
        await reader.read()

    upstream = await asyncio.start_server(ticker, "127.0.0.2", 0)
    port = upstream.sockets[0].getsockname()[1]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    proxy = EgressProxy(
        NetworkPolicy("allowlist", ("127.0.0.2",)), sandbox="host", limits=EgressLimits(idle_timeout_s=0.6)
    )
    url = await proxy.start(listener)
    host, proxy_port = url.removeprefix("http://").split(":")
    tunnels = {}
    for kind in (b"t", b"s"):
        reader, writer = await asyncio.open_connection(host, int(proxy_port))
        writer.write(f"CONNECT 127.0.0.2:{port} HTTP/1.1\r\n\r\n".encode() + kind)
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        tunnels[kind] = (reader, writer)
    try:
        await asyncio.sleep(1.5)
        busy, silent = tunnels[b"t"][0], tunnels[b"s"][0]
        assert await asyncio.wait_for(silent.read(), 2) == b""  # closed by the proxy
        assert len(await busy.read(5)) > 0 and not busy.at_eof()
    finally:
        for _, writer in tunnels.values():
            writer.close()
        await proxy.close()
        upstream.close()
