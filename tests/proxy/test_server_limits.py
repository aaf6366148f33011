"""Bad input at the HTTP edge is always a 4xx in the protocol's own shape, never a 500 or a
stalled proxy: deep nesting anywhere in a body (also inside tool schemas, tool inputs and
JSON-string arguments), bodies over the size limit (chunked or not, every protocol route),
large valid bodies (handled off the event loop while other sessions are answered), slow
senders, sampling values vLLM would refuse, bad replica urls."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import replace

import aiohttp
import pytest

from proxy import server as server_module
from proxy.errors import InvalidRequest
from proxy.server import DEFAULT_MAX_BODY_BYTES
from proxy.session import Session, SessionConfig
from tests.doubles.scripted_vllm import ScriptedVLLM
from tests.proxy._support import HOLE, body_with, proxy_server

ANTHROPIC = {"anthropic-version": "2023-06-01", "Content-Type": "application/json"}
OPENAI = {"Content-Type": "application/json"}
USER = {"role": "user", "content": "hi"}
CASES = {
    # (route, protocol, body)
    "anthropic top-level field": (
        "messages",
        "anthropic",
        {"model": "m", "max_tokens": 8, "messages": [USER], "metadata": HOLE},
    ),
    "anthropic tool schema": (
        "messages",
        "anthropic",
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [USER],
            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"p": HOLE}}}],
        },
    ),
    "anthropic tool input": (
        "messages",
        "anthropic",
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                USER,
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"x": HOLE}}],
                },
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
            ],
        },
    ),
    "anthropic tool result": (
        "messages",
        "anthropic",
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                USER,
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": HOLE}]},
            ],
        },
    ),
    "anthropic message content": (
        "messages",
        "anthropic",
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": HOLE}]},
    ),
    "anthropic count_tokens tool schema": (
        "messages/count_tokens",
        "anthropic",
        {
            "model": "m",
            "messages": [USER],
            "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"p": HOLE}}}],
        },
    ),
    "openai tool parameters": (
        "chat/completions",
        "openai",
        {
            "model": "m",
            "messages": [USER],
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "properties": {"p": HOLE}}},
                }
            ],
        },
    ),
    "openai tool-call arguments (a JSON string)": (
        "chat/completions",
        "openai",
        {
            "model": "m",
            "messages": [
                USER,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"x":' + HOLE + "}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ],
        },
    ),
    "openai tool message content": (
        "chat/completions",
        "openai",
        {"model": "m", "messages": [USER, {"role": "tool", "tool_call_id": "c1", "content": HOLE}]},
    ),
    "openai whole body": ("chat/completions", "openai", HOLE),
}


@pytest.fixture
async def served(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        yield srv, dbl


def _assert_shape(protocol: str, status: int, payload: dict) -> None:
    assert 400 <= status < 500, (status, payload)
    if protocol == "anthropic":
        assert payload["type"] == "error" and isinstance(payload["error"]["type"], str), payload
    else:
        assert isinstance(payload["error"]["message"], str) and payload["error"]["type"], payload


@pytest.mark.parametrize("depth", [300, 1000, 5000])
@pytest.mark.parametrize("case", list(CASES))
async def test_deep_nesting_anywhere_is_a_4xx_in_the_protocols_shape(served, case, depth):
    srv, dbl = served
    route, protocol, template = CASES[case]
    h = srv.open_session()
    async with aiohttp.ClientSession() as http:
        r = await http.post(
            f"{h.anthropic_base_url}/v1/{route}",
            data=body_with(template, depth),
            headers=ANTHROPIC if protocol == "anthropic" else OPENAI,
        )
        _assert_shape(protocol, r.status, await r.json())
        # the session still works afterwards
        ok = await http.post(f"{h.openai_base_url}/chat/completions", json={"model": "m", "messages": [USER]})
        assert ok.status == 200


async def test_a_deep_value_in_an_ignored_field_is_ignored_up_to_the_parsers_limit(served):
    """A field the proxy never reads is not walked (no cost on every turn): up to orjson's
    1024 levels it is ignored like any unknown field, deeper the body is not parsed (400)."""
    srv, _ = served
    h = srv.open_session()
    template = {"model": "m", "messages": [USER], "response_format": HOLE}
    async with aiohttp.ClientSession() as http:
        for depth, status in ((1000, 200), (1100, 400)):
            r = await http.post(
                f"{h.openai_base_url}/chat/completions", data=body_with(template, depth), headers=OPENAI
            )
            assert r.status == status, await r.text()
            if status == 400:
                _assert_shape("openai", r.status, await r.json())


async def test_moderate_nesting_still_works(served):
    srv, _ = served
    h = srv.open_session()
    route, _, template = CASES["anthropic tool schema"]
    async with aiohttp.ClientSession() as http:
        r = await http.post(
            f"{h.anthropic_base_url}/v1/{route}", data=body_with(template, 100), headers=ANTHROPIC
        )
        assert r.status == 200, await r.text()


async def _chunks(n: int, size: int):
    for _ in range(n):
        yield b" " * size


@pytest.mark.parametrize("protocol", ["anthropic", "openai"])
async def test_a_chunked_body_over_the_limit_is_413(tok, protocol):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url, max_body_bytes=64 * 1024) as srv:
        h = srv.open_session()
        route = "messages" if protocol == "anthropic" else "chat/completions"
        async with aiohttp.ClientSession() as http:
            # an async generator body is sent with Transfer-Encoding: chunked, no Content-Length
            r = await http.post(
                f"{h.anthropic_base_url}/v1/{route}",
                data=_chunks(32, 4096),
                headers=ANTHROPIC if protocol == "anthropic" else OPENAI,
            )
            payload = await r.json()
            assert r.status == 413, payload
            _assert_shape(protocol, r.status, payload)
            assert "exceeds the limit of 65536 bytes" in json.dumps(payload)


ROUTES = {
    # route: protocol
    "messages": "anthropic",
    "messages/count_tokens": "anthropic",
    "chat/completions": "openai",
    "responses": "openai",
}


@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_body_over_the_default_limit_is_413_in_the_protocols_shape(served, route):
    """One byte over the server's own limit (a valid JSON body padded with spaces), declared by
    Content-Length: refused before it is read."""
    srv, dbl = served
    assert srv.max_body_bytes == DEFAULT_MAX_BODY_BYTES
    h = srv.open_session()
    body = json.dumps({"model": "m", "max_tokens": 8, "messages": [USER]}).encode()
    body += b" " * (DEFAULT_MAX_BODY_BYTES + 1 - len(body))
    protocol = ROUTES[route]
    async with aiohttp.ClientSession() as http:
        r = await http.post(
            f"{h.anthropic_base_url}/v1/{route}",
            data=body,
            headers=ANTHROPIC if protocol == "anthropic" else OPENAI,
        )
        payload = await r.json()
    assert r.status == 413, payload
    _assert_shape(protocol, r.status, payload)
    assert f"exceeds the limit of {DEFAULT_MAX_BODY_BYTES} bytes" in json.dumps(payload)
    assert dbl.requests == []


async def test_stop_does_not_wait_for_a_refused_body_that_never_comes(tok):
    """A client that got its 413 and stopped sending leaves aiohttp lingering for the rest of
    the body (10 s); stop() gives such leftovers a second, not aiohttp's 60 s."""
    async with ScriptedVLLM(tok) as dbl:
        srv = proxy_server(tok, dbl.url)
        async with srv:
            h = srv.open_session()
            body = b" " * (DEFAULT_MAX_BODY_BYTES + 1)
            async with aiohttp.ClientSession() as http:
                r = await http.post(f"{h.openai_base_url}/chat/completions", data=body, headers=OPENAI)
                assert r.status == 413
            started = asyncio.get_running_loop().time()
        assert asyncio.get_running_loop().time() - started < 5


@pytest.mark.parametrize("route", ["messages", "chat/completions", "responses"])
async def test_a_large_body_over_the_context_is_refused_before_it_is_encoded(served, monkeypatch, route):
    """A 2 MiB message under the body limit but far over the 4096-token context gets the answer
    a prompt over the context gets in that protocol (the same status, shape and wording as a
    small prompt found too long by its exact count, only N differs), from the worker thread,
    without encoding its text; the session notes it as overlong and sends nothing."""
    srv, dbl = served
    protocol = ROUTES[route]

    async def ask(text: str) -> tuple[int, dict, list[int], Session]:
        h = srv.open_session()
        session = srv.session(h.session_id)
        encoded: list[int] = []
        encode = session.tracker._encode
        monkeypatch.setattr(session.tracker, "_encode", lambda t: encoded.append(len(t)) or encode(t))
        body: dict = {"model": "m", "max_tokens": 8}
        if route == "responses":
            body["input"] = text
        else:
            body["messages"] = [{"role": "user", "content": text}]
        async with aiohttp.ClientSession() as http:
            r = await http.post(
                f"{h.anthropic_base_url}/v1/{route}",
                json=body,
                headers=ANTHROPIC if protocol == "anthropic" else OPENAI,
            )
            return r.status, await r.json(), encoded, session

    late = await ask("x " * 5000)  # over the context by its exact count only
    early = await ask("base64+/" * (256 * 1024))
    assert late[2] and early[2] == [] and dbl.requests == []
    assert early[0] == late[0] == 400, (early[1], late[1])
    _assert_shape(protocol, early[0], early[1])
    assert re.sub(r"\d+", "N", json.dumps(early[1])) == re.sub(r"\d+", "N", json.dumps(late[1]))
    assert "4096" in json.dumps(early[1])
    for _, _, _, session in (late, early):
        assert session.overlong and session.trajectory.counters.overlong == 1


@pytest.mark.parametrize("stage", ["parse", "prepare"])
async def test_a_large_body_is_handled_off_the_event_loop(tok, monkeypatch, stage):
    """A large body is decoded and parsed (``parse``), and its turn prepared (``prepare``), in
    the worker thread; here that step is held until another session has had its answers. Were
    it on the event loop, the bystander could never be answered first."""
    gate, held_in = threading.Event(), []

    def held(fn, large=lambda *a: True):
        def run(*args):
            if large(*args):
                held_in.append(threading.current_thread() is not threading.main_thread())
                assert gate.wait(60), "the bystander was not answered while the large body was held"
            return fn(*args)

        return run

    async with (
        ScriptedVLLM(tok, max_model_len=16384) as dbl,
        proxy_server(tok, dbl.url, max_context_tokens=16384) as srv,
    ):
        srv.large_body_bytes = 8 * 1024
        big, bystander = srv.open_session(), srv.open_session()
        if stage == "parse":
            decode = held(server_module._decode_json, lambda raw: len(raw) >= srv.large_body_bytes)
            monkeypatch.setattr(server_module, "_decode_json", decode)
        else:
            tracker = srv.session(big.session_id).tracker
            monkeypatch.setattr(tracker, "prepare", held(tracker.prepare))
        body = {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "hello world " * 900}],
        }
        async with aiohttp.ClientSession() as http:
            large = asyncio.ensure_future(
                http.post(f"{big.anthropic_base_url}/v1/messages", json=body, headers=ANTHROPIC)
            )
            for _ in range(3000):
                if held_in or large.done():
                    break
                await asyncio.sleep(0.01)
            assert held_in == [True], "the large body's step did not run in the worker thread"
            for _ in range(3):
                r = await http.post(
                    f"{bystander.openai_base_url}/chat/completions", json={"model": "m", "messages": [USER]}
                )
                assert r.status == 200, await r.text()
            assert not large.done()
            gate.set()
            r = await large
            assert r.status == 200, await r.text()
            assert (await r.json())["type"] == "message"
        assert srv.session_stats(big.session_id).turns == 1
        assert srv.session_stats(bystander.session_id).turns == 3


async def test_slow_senders_are_cut_off(tok):
    """A connection that never completes its request head is closed after header_timeout_s;
    a body that does not arrive within body_timeout_s is a 408 in the protocol's shape."""
    async with ScriptedVLLM(tok) as dbl:
        srv = proxy_server(tok, dbl.url)
        srv.header_timeout_s, srv.body_timeout_s = 0.5, 0.5
        async with srv:
            h = srv.open_session()
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            writer.write(b"POST /s/x/y/v1/messages HTTP/1.1\r\nHost: x\r\n")  # no end of head
            await writer.drain()
            assert await asyncio.wait_for(reader.read(), 10) == b""  # closed by the proxy
            writer.close()

            path = h.anthropic_base_url.split(f":{srv.port}", 1)[1] + "/v1/messages"
            reader, writer = await asyncio.open_connection(srv.host, srv.port)
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nanthropic-version: 2023-06-01\r\n"
                "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{".encode()
            )
            await writer.drain()
            # the answer by its length: aiohttp then lingers (up to 10 s) for the unsent body
            # before it closes the connection, so reading to EOF would wait for that too
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert head.startswith(b"HTTP/1.1 408"), head[:200]
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            assert length, head
            body = await asyncio.wait_for(reader.readexactly(int(length.group(1))), 30)
            writer.close()
            payload = json.loads(body)
            _assert_shape("anthropic", 408, payload)
            assert "not received within 0.5 s" in payload["error"]["message"]


async def test_sampling_vllm_would_refuse_is_a_400_at_session_open(served):
    srv, _ = served
    async with aiohttp.ClientSession(headers=srv.management_headers) as http:
        for sampling in (
            {"max_tokens": -3},
            {"max_tokens": 0},
            {"temperature": -1},
            {"top_p": 0},
            {"top_k": 0},
            {"stop": [""]},
        ):
            r = await http.post(f"{srv.management_url}/sessions", json={"sampling": sampling})
            body = await r.json()
            assert r.status == 400 and body["error"]["type"] == "InvalidRequest", (sampling, body)
            assert f"sampling.{next(iter(sampling))}" in body["error"]["message"]
    with pytest.raises(InvalidRequest, match="max_tokens"):
        srv.open_session(replace(srv.defaults, sampling=replace(srv.defaults.sampling, max_tokens=-3)))
    assert not srv._sessions
    assert isinstance(srv.defaults, SessionConfig)
