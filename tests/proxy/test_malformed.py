"""Hypothesis: malformed and random bodies to every route never produce a 5xx.

The proxy (over the scripted vLLM double) runs in a background thread with its own event
loop; hypothesis drives it with a plain blocking HTTP client. A bystander session holds a
conversation before and after the barrage and must continue unaffected.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._hypothesis import examples
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import HOLE, body_with, load_tokenizer, proxy_server

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)

VALID = {
    "messages": {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    "messages/count_tokens": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
}
KEYS = [
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "stream",
    "stop",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "thinking",
    "n",
    "max_completion_tokens",
    "stream_options",
    "metadata",
]


def _mutations(route: str):
    """A valid body with one top-level field replaced, or one message replaced, by junk."""
    base = VALID[route]
    top = st.tuples(st.sampled_from(KEYS) | st.text(max_size=8), json_values).map(
        lambda kv: {**base, kv[0]: kv[1]}
    )
    msg = json_values.map(lambda v: {**base, "messages": [v]})
    block = st.tuples(
        st.sampled_from(["text", "tool_use", "tool_result", "thinking", "image", "x"]), json_values
    ).map(
        lambda tv: {
            **base,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": tv[0], "text": tv[1], "input": tv[1], "content": tv[1], "tool_use_id": tv[1]}
                    ],
                }
            ],
        }
    )
    return top | msg | block


class ThreadedProxy:
    """ScriptedVLLM + ProxyServer on an event loop in a daemon thread."""

    def __init__(self, tok) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.tok = tok
        self.dbl = self.srv = None
        self.call(self._start())

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    async def _start(self) -> None:
        self.dbl = await ScriptedVLLM(self.tok, default=Reply("OK")).start()
        self.srv = proxy_server(self.tok, self.dbl.url, max_body_bytes=64 * 1024)
        await self.srv.start()

    async def _stop(self) -> None:
        await self.srv.stop()
        await self.dbl.stop()

    def close(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def post(
    url: str,
    body: bytes,
    headers: dict[str, str] | None = None,
    method: str = "POST",
    chunk: int | None = None,
) -> tuple[int, bytes]:
    """``chunk``: send the body with Transfer-Encoding: chunked in pieces of that size."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.request(
            method,
            parts.path + (f"?{parts.query}" if parts.query else ""),
            body=body if chunk is None else iter([body[i : i + chunk] for i in range(0, len(body), chunk)]),
            headers={"Content-Type": "application/json", **(headers or {})},
            encode_chunked=chunk is not None,
        )
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def proxy(tiny_model_dir) -> Iterator[ThreadedProxy]:
    p = ThreadedProxy(load_tokenizer(tiny_model_dir))
    yield p
    p.close()


@pytest.fixture(scope="module")
def bystander(proxy):
    """A session with one turn recorded before the barrage."""
    h = proxy.srv.open_session()
    body = {"model": "m", "messages": [{"role": "user", "content": "first"}]}
    status, raw = post(h.openai_base_url + "/chat/completions", json.dumps(body).encode())
    assert status == 200
    return h, body["messages"] + [json.loads(raw)["choices"][0]["message"]]


@pytest.fixture(scope="module")
def target(proxy):
    return proxy.srv.open_session()


ROUTES = list(VALID)
FUZZ = settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _assert_client_error(status: int, raw: bytes, route: str, allow_ok: bool) -> None:
    assert status < 500, (route, status, raw[:300])
    assert allow_ok or 400 <= status < 500, (route, status, raw[:300])
    if status >= 400:
        payload = json.loads(raw)
        assert "error" in payload  # both protocols put the error under "error"


@FUZZ
@given(route=st.sampled_from(ROUTES), value=json_values)
def test_random_json_bodies(proxy, bystander, target, route, value):
    status, raw = post(f"{target.openai_base_url}/{route}", json.dumps(value).encode())
    _assert_client_error(status, raw, route, allow_ok=False)


@FUZZ
@given(route=st.sampled_from(ROUTES), body=st.binary(max_size=200))
def test_random_bytes(proxy, bystander, target, route, body):
    status, raw = post(f"{target.openai_base_url}/{route}", body)
    _assert_client_error(status, raw, route, allow_ok=False)


@FUZZ
@given(data=st.data())
def test_mutated_valid_bodies(proxy, bystander, target, data):
    route = data.draw(st.sampled_from(ROUTES))
    body = data.draw(_mutations(route))
    headers = {"anthropic-version": "2023-06-01"} if route.startswith("messages") else {}
    status, raw = post(f"{target.anthropic_base_url}/v1/{route}", json.dumps(body).encode(), headers)
    # A mutation can leave the body valid (e.g. another model name): then 200 is right.
    _assert_client_error(status, raw, route, allow_ok=True)


@FUZZ
@given(
    path=st.text(alphabet="abcdefghijklmnopqrstuvwxyz/._-%", max_size=30),
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE"]),
)
def test_random_paths_and_management(proxy, target, path, method):
    for url in (
        f"{target.openai_base_url}/{path}",
        f"{proxy.srv.base_url}/sessions/{path}",
        f"{proxy.srv.management_url}/sessions/{path}",
        f"{proxy.srv.base_url}/s/{target.session_id}/wrong/v1/{path}",
    ):
        status, raw = post(url, b"{}", method=method)
        assert status < 500, (url, status, raw[:200])


@FUZZ
@given(
    data=st.data(),
    depth=st.integers(min_value=1, max_value=1500),
    chunk=st.none() | st.integers(min_value=1, max_value=4096),
)
def test_deep_nesting_anywhere_and_chunked_bodies(proxy, bystander, target, data, depth, chunk):
    """A valid body with one value (a top-level field, a message, a block's text/input/content,
    or the whole body) replaced by a value nested ``depth`` levels, sent whole or chunked."""
    route = data.draw(st.sampled_from(ROUTES))
    spot = data.draw(_mutations(route).map(lambda b: json.loads(json.dumps(b))))
    body = _with_hole(spot, data.draw(st.randoms()))
    headers = {"anthropic-version": "2023-06-01"} if route.startswith("messages") else {}
    raw = body_with(body, depth)
    status, reply = post(f"{target.anthropic_base_url}/v1/{route}", raw, headers, chunk=chunk)
    if len(raw) > 64 * 1024:
        assert status == 413, (status, reply[:200])
    _assert_client_error(status, reply, route, allow_ok=True)


def _with_hole(value, rnd):
    """``value`` with one random leaf or container replaced by HOLE (the value itself if none)."""
    spots = []

    def walk(v, parent, key):
        spots.append((parent, key))
        children = v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()
        for k, child in children:
            walk(child, v, k)

    walk(value, None, None)
    parent, key = rnd.choice(spots)
    if parent is None:
        return HOLE
    parent[key] = HOLE
    return value


def test_oversized_body_is_413(proxy, target):
    for chunk in (None, 1000):  # with Content-Length, and chunked (no length known up front)
        status, raw = post(
            f"{target.openai_base_url}/chat/completions", b"[" + b"1," * 40000 + b"1]", chunk=chunk
        )
        assert status == 413 and json.loads(raw)["error"], (chunk, status, raw[:200])


def test_bystander_session_unaffected(proxy, bystander, target):
    # Runs last in this module: after every barrage above.
    h, messages = bystander
    messages = messages + [{"role": "user", "content": "second"}]
    status, raw = post(
        h.openai_base_url + "/chat/completions", json.dumps({"model": "m", "messages": messages}).encode()
    )
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"] == "OK"
    traj = proxy.srv.session(h.session_id).trajectory
    assert traj.counters.turns == 2 and len(traj.segments) == 1  # the second turn extended the first
    assert (
        traj.segments[0].full_ids[: len(proxy.dbl.requests[-1]["prompt"])] == proxy.dbl.requests[-1]["prompt"]
    )
