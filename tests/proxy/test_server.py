"""ProxyServer over HTTP (aiohttp client): management API, routing, limits, keep-alive streaming."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import aiohttp
import pytest

from proxy.checkpoint import MemorySink
from proxy.errors import NotFound
from proxy.session import SessionConfig
from proxy.trajectory import Trajectory
from tests._wait import wait_until
from tests.doubles.scripted_vllm import HTTPFailure, Reply, ScriptedVLLM
from tests.proxy._support import proxy_server

ANTHROPIC = {"anthropic-version": "2023-06-01"}
MSG = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _events(raw: str) -> list[str]:
    return [line[len("event: ") :] for line in raw.splitlines() if line.startswith("event: ")]


async def test_management_api_roundtrip(tok):
    async with ScriptedVLLM(tok, script=[Reply("hello")]) as dbl, proxy_server(tok, dbl.url) as srv:
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            r = await http.post(
                f"{srv.management_url}/sessions",
                json={
                    "sampling": {"temperature": 0.5, "max_tokens": 20},
                    "max_context_tokens": 3000,
                    "metadata": {"trial_id": "t-1"},
                },
            )
            h = await r.json()
            assert h["anthropic_base_url"].startswith(f"{srv.base_url}/s/{h['session_id']}/")
            assert h["openai_base_url"] == h["anthropic_base_url"] + "/v1"
            r = await http.post(
                h["anthropic_base_url"] + "/v1/messages?beta=true", json=MSG, headers=ANTHROPIC
            )
            assert r.status == 200 and (await r.json())["content"][0]["text"] == "hello"
            assert dbl.requests[0]["temperature"] == 0.5 and dbl.requests[0]["max_tokens"] == 20
            own = {"X-Trialflow-Session-Secret": h["secret"]}
            stats = await (
                await http.get(f"{srv.management_url}/sessions/{h['session_id']}", headers=own)
            ).json()
            assert stats["turns"] == 1 and stats["metadata"] == {"trial_id": "t-1"} and not stats["busy"]
            r = await http.post(f"{srv.management_url}/sessions/{h['session_id']}/close", headers=own)
            t = Trajectory.from_bytes(await r.read())
            assert t.counters.turns == 1 and t.segments[0].response_ids[-1] == tok.eos_token_id
            # Closed: the protocol route and the management routes answer 404.
            r = await http.post(h["anthropic_base_url"] + "/v1/messages", json=MSG, headers=ANTHROPIC)
            assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"
            closed = f"{srv.management_url}/sessions/{h['session_id']}"
            assert (await http.post(f"{closed}/close", headers=own)).status == 404
            assert (await http.get(closed, headers=own)).status == 404
            # Bad management bodies are 400s.
            for bad in (
                {"sampling": {"temperature": "hot"}},
                {"nope": 1},
                [1],
                {"max_context_tokens": -1},
                {"tool_parser": "no_such_parser"},
            ):
                assert (await http.post(f"{srv.management_url}/sessions", json=bad)).status == 400


async def test_close_json_summary(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            await http.post(h.openai_base_url + "/chat/completions", json=CHAT)
            summary = await (
                await http.post(
                    f"{srv.management_url}/sessions/{h.session_id}/close?format=json",
                    headers={"X-Trialflow-Session-Secret": h.secret},
                )
            ).json()
    assert summary["counters"]["turns"] == 1 and summary["segments"][0]["kind"] == "main"
    assert summary["segments"][0]["generated_tokens"] == summary["turns"][0]["completion_tokens"]


async def test_wrong_secret_and_unknown_routes_are_404_in_protocol_shape(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        other = srv.open_session()
        wrong = f"{srv.base_url}/s/{h.session_id}/{other.secret}/v1"
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            r = await http.post(wrong + "/messages", json=MSG, headers=ANTHROPIC)
            assert r.status == 404 and (await r.json())["type"] == "error"
            r = await http.post(wrong + "/chat/completions", json=CHAT)
            assert r.status == 404 and "error" in await r.json()
            r = await http.get(h.openai_base_url + "/nothing/here")
            assert r.status == 404 and "error" in await r.json()
            r = await http.get(h.openai_base_url + "/models")
            assert (await r.json())["data"][0]["id"] == "scripted"
            r = await http.get(h.anthropic_base_url + "/v1/models", headers=ANTHROPIC)
            assert (await r.json())["data"][0]["type"] == "model"
        assert srv.session_stats(h.session_id).turns == 0 and srv.session_stats(other.session_id).turns == 0
    assert dbl.requests == []


async def test_body_limits_and_malformed_json(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        srv.max_body_bytes = 1000
        h = srv.open_session()
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            big = dict(MSG, messages=[{"role": "user", "content": "x" * 2000}])
            r = await http.post(h.anthropic_base_url + "/v1/messages", json=big, headers=ANTHROPIC)
            assert r.status == 413 and (await r.json())["error"]["type"] == "request_too_large"
            r = await http.post(
                h.openai_base_url + "/chat/completions",
                data=b"{not json",
                headers={"Content-Type": "application/json"},
            )
            assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"


async def test_count_tokens_matches_the_prompt_sent(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            r = await http.post(
                h.anthropic_base_url + "/v1/messages/count_tokens",
                json={"model": "m", "messages": MSG["messages"]},
                headers=ANTHROPIC,
            )
            n = (await r.json())["input_tokens"]
            await http.post(h.anthropic_base_url + "/v1/messages", json=MSG, headers=ANTHROPIC)
    assert n == len(dbl.requests[0]["prompt"])


async def test_streaming_sends_keepalives_while_generating(tok):
    async with (
        ScriptedVLLM(tok, default=Reply("slow answer", delay_s=1.0)) as dbl,
        proxy_server(tok, dbl.url) as srv,
    ):
        h = srv.open_session()
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            r = await http.post(
                h.anthropic_base_url + "/v1/messages", json=dict(MSG, stream=True), headers=ANTHROPIC
            )
            events = _events(await r.text())
            r = await http.post(h.openai_base_url + "/chat/completions", json=dict(CHAT, stream=True))
            raw = await r.text()
    assert events[0] == "ping" and events.count("ping") >= 2
    assert events[events.index("message_start") :][-1] == "message_stop"
    assert raw.startswith(": keep-alive\n\n") and raw.rstrip().endswith("data: [DONE]")
    text = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in raw.splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    )
    assert text == "slow answer"


async def test_stream_errors_keep_status_when_fast_and_become_events_when_late(tok):
    async with ScriptedVLLM(tok, script=[HTTPFailure(500, delay_s=0.4)]) as dbl:
        async with proxy_server(tok, dbl.url, max_context_tokens=30, keepalive_s=0.1) as srv:
            h = srv.open_session()
            async with aiohttp.ClientSession(headers=srv.management_headers) as http:
                # Fast failure (context exhausted): a plain 400, as Claude Code expects.
                long = dict(MSG, stream=True, messages=[{"role": "user", "content": "x " * 100}])
                r = await http.post(h.anthropic_base_url + "/v1/messages", json=long, headers=ANTHROPIC)
                body = await r.json()
                assert r.status == 400 and "prompt is too long" in body["error"]["message"]
                assert srv.session_stats(h.session_id).overlong
                # Late failure (the only replica answers 500 after the stream began): an error event.
                ok = srv.open_session(SessionConfig(model="scripted"))  # limit learned from /v1/models
                r = await http.post(
                    ok.anthropic_base_url + "/v1/messages", json=dict(MSG, stream=True), headers=ANTHROPIC
                )
                raw = await r.text()
                assert r.status == 200 and _events(raw)[0] == "ping" and _events(raw)[-1] == "error"
                assert '"overloaded_error"' in raw
                # The failed turn recorded nothing; the session goes on.
                assert srv.session_stats(ok.session_id).turns == 0
                r = await http.post(ok.openai_base_url + "/chat/completions", json=dict(CHAT, stream=True))
                assert r.status == 200 and '"content":"OK"' in await r.text()
                assert srv.session_stats(ok.session_id).turns == 1


async def test_sessions_are_isolated_and_checkpointed(tok):
    sink = MemorySink()
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        a = srv.open_session(SessionConfig(model="scripted", checkpoint=sink))
        b = srv.open_session(SessionConfig(model="scripted", checkpoint=sink))
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            await http.post(a.openai_base_url + "/chat/completions", json=CHAT)
            await http.post(
                b.openai_base_url + "/chat/completions",
                json=dict(CHAT, messages=[{"role": "user", "content": "other"}]),
            )
            await http.post(a.openai_base_url + "/chat/completions", json=CHAT)
        ta = await srv.close_session(a.session_id)
        assert srv.session(b.session_id).trajectory.counters.turns == 1
        with pytest.raises(NotFound):
            srv.session(a.session_id)
    assert ta.counters.turns == 2
    assert len(sink.payloads[a.session_id]) == 2 and len(sink.payloads[b.session_id]) == 1


async def test_concurrent_requests_in_one_session_are_serialised(tok):
    async with (
        ScriptedVLLM(tok, default=Reply("slow", delay_s=0.3)) as dbl,
        proxy_server(tok, dbl.url) as srv,
    ):
        h = srv.open_session()
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:

            async def ask(text):
                r = await http.post(
                    h.openai_base_url + "/chat/completions",
                    json=dict(CHAT, messages=[{"role": "user", "content": text}]),
                )
                return r.status

            assert await asyncio.gather(ask("a"), ask("b"), ask("c")) == [200, 200, 200]
        assert srv.session_stats(h.session_id).turns == 3
    spans = sorted(dbl.timings)
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))


async def test_ignored_fields_logged_once_per_session(tok, caplog):
    caplog.set_level("INFO", logger="proxy.session")
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            for _ in range(2):
                r = await http.post(
                    h.anthropic_base_url + "/v1/messages",
                    headers=ANTHROPIC,
                    json=dict(MSG, metadata={"user_id": "u"}, context_management={"edits": []}),
                )
                assert r.status == 200
    lines = [r.getMessage() for r in caplog.records if "ignoring request fields" in r.getMessage()]
    assert len(lines) == 1 and "context_management" in lines[0]


async def test_client_leaving_mid_stream_does_not_lose_the_turn(tok):
    async with (
        ScriptedVLLM(tok, default=Reply("late", delay_s=0.6)) as dbl,
        proxy_server(tok, dbl.url) as srv,
    ):
        h = srv.open_session()
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            r = await http.post(
                h.anthropic_base_url + "/v1/messages", json=dict(MSG, stream=True), headers=ANTHROPIC
            )
            await r.content.readline()  # the first keep-alive ping arrived; now hang up
            r.close()
        await wait_until(lambda: srv.session_stats(h.session_id).turns == 1, what="the turn recorded")
        stats = srv.session_stats(h.session_id)
    assert stats.turns == 1 and stats.completion_tokens > 0


async def test_weight_sync_mid_turn_widens_the_policy_version_range(tok):
    """A turn generating while the trainer syncs weights (version 3 -> 4) records both versions;
    the next turn records only 4; new sessions start from 4; bad bodies are 400s."""
    async with (
        ScriptedVLLM(tok, script=[Reply("first", delay_s=1.0), Reply("second")]) as dbl,
        proxy_server(tok, dbl.url) as srv,
    ):
        h = srv.open_session(SessionConfig(policy_version=3))
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            turn = asyncio.create_task(http.post(h.openai_base_url + "/chat/completions", json=CHAT))
            while not dbl.requests:  # the generation is running at the backend
                await asyncio.sleep(0.05)
            r = await http.post(f"{srv.management_url}/policy_version", json={"version": 4})
            assert await r.json() == {"version": 4, "sessions": 1}
            assert (await turn).status == 200
            seg = srv.session(h.session_id).trajectory.segments[0]
            assert (seg.policy_version_min, seg.policy_version_max) == (3, 4)
            for bad in ({"version": "4"}, {"version": True}, {}, [4]):
                assert (await http.post(f"{srv.management_url}/policy_version", json=bad)).status == 400
        assert srv.open_session().session_id and srv.defaults.policy_version == 4
        t = await srv.close_session(h.session_id)
    rebuilt = Trajectory.from_bytes(t.to_bytes())
    assert (rebuilt.segments[0].policy_version_min, rebuilt.segments[0].policy_version_max) == (3, 4)


async def test_replicas_join_and_leave_over_the_management_api(tok):
    """A second replica added over HTTP takes new sessions (least loaded); removing the first
    moves its stuck session over on the next turn; malformed bodies change nothing."""
    async with ScriptedVLLM(tok) as first, ScriptedVLLM(tok) as second, proxy_server(tok, first.url) as srv:
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            mgmt = f"{srv.management_url}/replicas"
            a = srv.open_session()
            assert (await http.post(a.openai_base_url + "/chat/completions", json=CHAT)).status == 200
            r = await http.post(mgmt, json={"add": [second.url + "/"]})
            listing = (await r.json())["replicas"]
            assert [x["url"] for x in listing] == [first.url, second.url]
            assert listing[0]["served"] == 1 and listing[1]["served"] == 0
            # a busy first replica: the new session goes to the idle second one
            slow = Reply("slow", delay_s=1.0)
            first.script.append(slow)
            b = srv.open_session()
            busy = asyncio.create_task(
                http.post(
                    a.openai_base_url + "/chat/completions",
                    json={
                        **CHAT,
                        "messages": [
                            *CHAT["messages"],
                            {"role": "assistant", "content": "ok"},
                            {"role": "user", "content": "more"},
                        ],
                    },
                )
            )
            while not first.requests[1:]:
                await asyncio.sleep(0.02)
            assert (await http.post(b.openai_base_url + "/chat/completions", json=CHAT)).status == 200
            assert len(second.requests) == 1
            assert (await busy).status == 200
            for bad in (
                {},
                {"add": "http://x:1"},
                {"add": ["ftp://x"]},
                {"add": ["http://x:1/v1"]},
                {"remove": [3]},
                {"drop": []},
                [first.url],
            ):
                assert (await http.post(mgmt, json=bad)).status == 400, bad
            assert len((await (await http.get(mgmt)).json())["replicas"]) == 2
            r = await http.post(mgmt, json={"remove": [first.url]})
            assert [x["url"] for x in (await r.json())["replicas"]] == [second.url]
            n_first = len(first.requests)
            assert (await http.post(a.openai_base_url + "/chat/completions", json=CHAT)).status == 200
            assert len(first.requests) == n_first and len(second.requests) == 2


async def test_lone_surrogates_are_a_400_not_a_failed_turn(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        body = b'{"model": "m", "stop": ["\\ud800"], "messages": [{"role": "user", "content": "hi"}]}'
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            r = await http.post(
                h.openai_base_url + "/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            )
            assert r.status == 400 and "surrogate" in (await r.json())["error"]["message"]
        assert not dbl.requests and srv.session_stats(h.session_id).turns == 0


async def test_sessions_naming_replicas_share_one_pool_and_its_health(tok):
    """Sessions with their own replica list (verl's rollout servers) share one started pool
    per set: new sessions spread over it, stick, and skip a replica its health loop marked
    down; the pool closes after its last session (linger 0 here)."""
    from proxy.pool import ReplicaPool
    from proxy.server import ProxyServer

    doubles = [await ScriptedVLLM(tok).start() for _ in range(3)]
    urls = [d.url for d in doubles]
    srv = ProxyServer(
        tokenizer=tok,
        defaults=SessionConfig(model="scripted", max_context_tokens=4096),
        pool_factory=lambda u: ReplicaPool(u, health_interval_s=0.05),
    )
    srv.shared_pools._linger_s = 0
    try:
        async with srv, aiohttp.ClientSession(headers=srv.management_headers) as http:
            handles = []
            for i in range(6):
                r = await http.post(
                    f"{srv.management_url}/sessions", json={"replicas": urls[::-1] if i % 2 else urls}
                )
                handles.append(await r.json())
                chat = handles[-1]["openai_base_url"] + "/chat/completions"
                assert (await http.post(chat, json=CHAT)).status == 200
            assert [len(d.requests) for d in doubles] == [2, 2, 2]
            listing = await (await http.get(f"{srv.management_url}/replicas")).json()
            assert len(listing["shared"]) == 1 and listing["shared"][0]["sessions"] == 6
            assert [r["sessions"] for r in listing["shared"][0]["replicas"]] == [2, 2, 2]
            doubles[0].healthy = False
            while listing["shared"][0]["replicas"][0]["up"]:
                await asyncio.sleep(0.05)
                listing = await (await http.get(f"{srv.management_url}/replicas")).json()
            for _ in range(4):
                h = srv.open_session(replace(srv.defaults, replicas=tuple(urls)))
                assert (await http.post(h.openai_base_url + "/chat/completions", json=CHAT)).status == 200
                handles.append({"session_id": h.session_id, "secret": h.secret})
            assert [len(d.requests) for d in doubles] == [2, 4, 4]
            for h in handles:
                await http.post(
                    f"{srv.management_url}/sessions/{h['session_id']}/close",
                    headers={"X-Trialflow-Session-Secret": h["secret"]},
                )
            assert (await (await http.get(f"{srv.management_url}/replicas")).json())["shared"] == []
    finally:
        for d in doubles:
            await d.stop()


async def test_bad_replica_urls_are_a_400_at_session_open(tok):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            for bad in (["http://127.0.0.1:99999"], ["http://h:0"], ["nope"], [dbl.url + "/v1"]):
                r = await http.post(f"{srv.management_url}/sessions", json={"replicas": bad})
                body = await r.json()
                assert r.status == 400 and body["error"]["type"] == "InvalidRequest", body
                assert "replicas" in body["error"]["message"]
            assert srv.shared_pools.pools() == [] and not srv._sessions


async def test_a_turn_on_a_replica_marked_down_mid_generation_moves_over_exactly(tok, tiny_model_dir):
    """The session's replica is SIGSTOPped while it generates turn 2; its probes go
    unanswered, and once that silence outlasts the busy grace (1 s here: a replica with a call
    in flight may be busy, not hung) the health loop marks it down, the call is cancelled and
    the turn completes on the other replica. The record holds exactly what that replica
    generated, nothing of the stopped one."""
    from proxy.pool import ReplicaPool
    from proxy.server import ProxyServer
    from tests.doubles.process import double_process
    from tests.doubles.scripted_vllm import fake_logprob

    async with double_process(tiny_model_dir, text="from a", delay_s=1.0) as a, ScriptedVLLM(tok) as b:
        b.default = Reply("from b")
        srv = ProxyServer(
            tokenizer=tok,
            defaults=SessionConfig(model="scripted", max_context_tokens=4096),
            pool_factory=lambda u: ReplicaPool(
                u, health_interval_s=0.2, health_timeout_s=0.5, busy_grace_s=1.0
            ),
        )
        async with srv, aiohttp.ClientSession(headers=srv.management_headers) as http:
            h = srv.open_session(replace(srv.defaults, replicas=(a.url, b.url)))
            chat = h.openai_base_url + "/chat/completions"
            r = await http.post(chat, json=CHAT)
            assert (await r.json())["choices"][0]["message"]["content"] == "from a"
            again = {
                **CHAT,
                "messages": [
                    *CHAT["messages"],
                    {"role": "assistant", "content": "from a"},
                    {"role": "user", "content": "more"},
                ],
            }
            turn = asyncio.create_task(http.post(chat, json=again))
            await wait_until(  # a has the request and sleeps in its 1 s delay
                lambda: any(
                    r.in_flight for p, _ in srv.shared_pools.pools() for r in p.replicas if r.url == a.url
                ),
                what="the turn in flight at a",
            )
            a.stop()
            r = await asyncio.wait_for(turn, 60)
            assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == "from b"
            t = await srv.close_session(h.session_id)
    assert [x.replica for x in t.turns] == [a.url, b.url]
    seg = t.segments[0]
    gen_b = tok.encode("from b", add_special_tokens=False) + [tok.eos_token_id]
    prompt_b = b.requests[0]["prompt"]
    assert seg.full_ids == prompt_b + gen_b  # one segment: turn 2's prompt extends turn 1
    n = len(gen_b)
    assert list(seg.response_ids[-n:]) == gen_b and list(seg.response_mask[-n:]) == [1] * n
    expected = [fake_logprob(tok_id, len(prompt_b) + i) for i, tok_id in enumerate(gen_b)]
    assert list(seg.response_logprobs[-n:]) == pytest.approx(expected)


async def test_management_listener_needs_its_token_and_the_session_secret(tok, tmp_path):
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        h = srv.open_session()
        async with aiohttp.ClientSession() as http:
            # The protocol port serves no management route at all.
            for method, path in (("POST", "/sessions"), ("GET", "/replicas"), ("POST", "/policy_version")):
                r = await http.request(method, srv.base_url + path, json={"version": 1})
                assert r.status == 404, path
            mgmt = srv.management_url
            assert srv.management_port != srv.port
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": srv.management_token}):
                for method, path in (("POST", "/sessions"), ("POST", "/replicas"), ("GET", "/replicas")):
                    r = await http.request(method, mgmt + path, json={"add": ["http://x:1"]}, headers=headers)
                    assert r.status == 401, (headers, path)
            assert [r.url for r in srv.pool.replicas] == [dbl.url]
            auth = srv.management_headers
            for secret in (None, "wrong", srv.open_session().secret):
                headers = {**auth, **({"X-Trialflow-Session-Secret": secret} if secret else {})}
                assert (await http.get(f"{mgmt}/sessions/{h.session_id}", headers=headers)).status == 404
                r = await http.post(f"{mgmt}/sessions/{h.session_id}/close", headers=headers)
                assert r.status == 404
            own = {**auth, "X-Trialflow-Session-Secret": h.secret}
            assert (await http.get(f"{mgmt}/sessions/{h.session_id}", headers=own)).status == 200
    # Over a Unix socket (mode 0600) with the same rules.
    from proxy.server import ProxyServer

    path = tmp_path / "mgmt.sock"
    async with ProxyServer(tokenizer=tok, replicas=[], management_socket=path) as srv:
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(path))) as http:
            assert (await http.post(f"{srv.management_url}/sessions", json={})).status == 401
            r = await http.post(f"{srv.management_url}/sessions", json={}, headers=srv.management_headers)
            assert r.status == 200 and (await r.json())["secret"]


async def test_turn_limit_is_a_400_in_each_protocols_shape(tok):
    """A session opened with max_turns=1 (management API) serves one turn, then refuses the
    next one with a fast 400 in the shape of the protocol asked, streaming or not, without
    reaching the replica."""
    async with ScriptedVLLM(tok) as dbl, proxy_server(tok, dbl.url) as srv:
        async with aiohttp.ClientSession(headers=srv.management_headers) as http:
            r = await http.post(f"{srv.management_url}/sessions", json={"max_turns": 1})
            h = await r.json()
            r = await http.post(h["openai_base_url"] + "/chat/completions", json=CHAT)
            assert r.status == 200
            for stream in (False, True):
                r = await http.post(
                    h["anthropic_base_url"] + "/v1/messages", json=dict(MSG, stream=stream), headers=ANTHROPIC
                )
                body = await r.json()
                assert r.status == 400 and body["type"] == "error", body
                assert body["error"]["type"] == "invalid_request_error"
                assert "turn limit reached" in body["error"]["message"]
                r = await http.post(
                    h["openai_base_url"] + "/chat/completions", json=dict(CHAT, stream=stream)
                )
                err = (await r.json())["error"]
                assert r.status == 400 and err["type"] == "invalid_request_error"
                assert err["code"] == "turn_limit_reached"
                r = await http.post(
                    h["openai_base_url"] + "/responses", json={"model": "m", "input": "hi", "stream": stream}
                )
                err = (await r.json())["error"]
                assert r.status == 400 and err["code"] == "turn_limit_reached"
            stats = srv.session_stats(h["session_id"])
            assert stats.turns == 1 and stats.counters["turn_limited"] == 6 and len(dbl.requests) == 1
            assert (await http.post(f"{srv.management_url}/sessions", json={"max_turns": 0})).status == 400
