"""`ProxyServer.serve_session`: a listener that serves one session's protocol routes only
(the sandbox forwarder's proxy side; its sandbox side is tested in tests/trialflow/sandbox)."""

from __future__ import annotations

import socket

import aiohttp
import pytest

from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import proxy_server

ANTHROPIC = {"anthropic-version": "2023-06-01"}
MSG = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _listener() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    return sock


async def test_bound_listener_serves_its_session_and_nothing_else(tok):
    script = [Reply("one"), Reply("two")]
    async with ScriptedVLLM(tok, script=script) as dbl, proxy_server(tok, dbl.url) as srv:
        mine, other = srv.open_session(), srv.open_session()
        base = await srv.serve_session(mine.session_id, _listener())
        assert base.startswith("http://127.0.0.1:") and mine.secret not in base
        async with aiohttp.ClientSession() as http:
            r = await http.post(f"{base}/v1/messages", json=MSG, headers=ANTHROPIC)
            assert r.status == 200 and (await r.json())["content"][0]["text"] == "one"
            r = await http.post(f"{base}/v1/chat/completions", json=CHAT)
            assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == "two"
            assert srv.session_stats(mine.session_id).turns == 2
            assert srv.session_stats(other.session_id).turns == 0
            # No management route, no other session's path, no way to the main app.
            for method, path in (
                ("POST", "/sessions"),
                ("GET", f"/sessions/{other.session_id}"),
                ("POST", f"/sessions/{other.session_id}/close"),
                ("POST", "/policy_version"),
                ("POST", "/replicas"),
                ("GET", "/replicas"),
                ("POST", f"/s/{other.session_id}/{other.secret}/v1/chat/completions"),
            ):
                r = await http.request(method, base + path, json={"version": 7, "add": ["http://x:1"]})
                assert r.status == 404, (method, path, r.status)
            assert [r.url for r in srv.pool.replicas] == [dbl.url]
        await srv.close_session(mine.session_id)
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientConnectionError):
                await http.get(f"{base}/v1/models")


async def test_serve_unknown_session_is_refused(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        from proxy.errors import NotFound

        with pytest.raises(NotFound):
            await srv.serve_session("nope", _listener())
