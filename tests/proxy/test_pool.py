"""ReplicaPool against scripted vLLM doubles: stickiness, load, failover, abort-resume."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from proxy.backend import CompletionRequest, VLLMClient
from proxy.errors import BackendHTTPError, GenerationAborted, ReplicaUnreachable
from proxy.pool import Deadlines, ReplicaPool, SharedPools, replica_url
from tests._wait import wait_until
from tests.doubles.process import double_process
from tests.doubles.scripted_vllm import (
    Abort,
    Drop,
    HTTPFailure,
    Reply,
    ScriptedVLLM,
    fake_experts,
    fake_logprob,
)

PROMPT = [11, 12, 13, 14]


def _req(max_tokens=64, prompt=PROMPT) -> CompletionRequest:
    return CompletionRequest(model="scripted", prompt_ids=list(prompt), max_tokens=max_tokens)


def _pool(*doubles, **kw) -> ReplicaPool:
    kw.setdefault("health_interval_s", None)
    kw.setdefault("outage_hold_s", 0.0)  # the hold has its own tests
    return ReplicaPool([d.url for d in doubles], client_factory=lambda u: VLLMClient(u, timeout_s=5), **kw)


async def test_sticky_then_least_loaded(tok):
    async with ScriptedVLLM(tok) as a, ScriptedVLLM(tok) as b:
        async with _pool(a, b) as pool:
            g1 = await pool.generate("s1", _req())
            # s1 sticks to its replica even though both are idle.
            assert [(await pool.generate("s1", _req())).replica for _ in range(3)] == [g1.replica] * 3
            # While s1's replica is busy, a new session goes to the idle one.
            a.default = b.default = Reply("slow", delay_s=0.5)
            busy = asyncio.create_task(pool.generate("s1", _req()))
            await wait_until(lambda: any(r.in_flight for r in pool.replicas), what="s1's turn in flight")
            g2 = await pool.generate("s2", _req())
            await busy
            assert g2.replica != g1.replica
            assert {r.url: r.served for r in pool.replicas} == {g1.replica: 5, g2.replica: 1}


async def test_failover_on_dead_replica_and_5xx(tok):
    async with ScriptedVLLM(tok, script=[HTTPFailure(503)]) as a, ScriptedVLLM(tok) as b:
        async with _pool(a, b) as pool:
            gen = await pool.generate("s", _req())  # a answers 503 -> replayed on b
            assert gen.replica == b.url and len(a.requests) == 1 and b.requests[0]["prompt"] == PROMPT
            await b.stop()  # the sticky replica dies -> back to a
            gen2 = await pool.generate("s", _req())
            assert gen2.replica == a.url
            assert [r.up for r in pool.replicas] == [True, False]


async def test_dropped_connection_fails_over(tok):
    async with ScriptedVLLM(tok, script=[Drop()]) as a, ScriptedVLLM(tok) as b:
        async with _pool(a, b) as pool:
            assert (await pool.generate("s", _req())).replica == b.url


async def test_all_dead_is_clear_error_and_4xx_not_retried(tok):
    async with ScriptedVLLM(tok, script=[HTTPFailure(400, "too long")]) as a, ScriptedVLLM(tok) as b:
        async with _pool(a, b) as pool:
            with pytest.raises(BackendHTTPError) as e:
                await pool.generate("s", _req())
            assert e.value.upstream_status == 400 and b.requests == []
            await a.stop()
            await b.stop()
            with pytest.raises(ReplicaUnreachable) as dead:
                await pool.generate("s", _req())
            assert a.url in str(dead.value) and b.url in str(dead.value)
    async with ReplicaPool([], health_interval_s=None, outage_hold_s=0) as empty:
        with pytest.raises(ReplicaUnreachable):
            await empty.generate("s", _req())


async def test_abort_is_resumed_into_one_generation(tok):
    first = tok.encode("alpha beta", add_special_tokens=False)
    second = tok.encode(" gamma", add_special_tokens=False)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    script = [
        Abort(token_ids=first, experts=(2, 2, 8)),
        Abort(token_ids=[], experts=None),
        Reply(token_ids=second, experts=(2, 2, 8)),
    ]
    async with ScriptedVLLM(tok, script=script) as a:
        async with _pool(a) as pool:
            gen = await pool.generate("s", _req(max_tokens=40))
    assert gen.token_ids == first + second + [eos]
    assert gen.prompt_token_ids == PROMPT and gen.finish_reason == "stop" and gen.resumed_after_abort == 2
    # Logprobs and experts line up with absolute positions, as if generated in one go.
    assert gen.logprobs == [fake_logprob(t, len(PROMPT) + i) for i, t in enumerate(gen.token_ids)]
    total = len(PROMPT) + len(gen.token_ids) - 1
    assert np.array_equal(gen.routed_experts, fake_experts(total, 2, 2, 8))
    # The resume re-sent prompt + tokens so far with the remaining budget.
    assert a.requests[1]["prompt"] == PROMPT + first and a.requests[1]["max_tokens"] == 40 - len(first)


async def test_abort_budget_and_give_up(tok):
    ids = tok.encode("alpha beta gamma", add_special_tokens=False)
    async with ScriptedVLLM(tok, script=[Abort(token_ids=ids)]) as a:
        async with _pool(a) as pool:
            gen = await pool.generate("s", _req(max_tokens=len(ids)))
            assert gen.finish_reason == "length" and gen.token_ids == ids
            a.default = Abort("x")
            pool.max_resumes = 2
            with pytest.raises(GenerationAborted):
                await pool.generate("s", _req())


async def test_health_checks_and_runtime_membership(tok):
    async with ScriptedVLLM(tok) as a, ScriptedVLLM(tok) as b:
        async with _pool(a, health_interval_s=0.05) as pool:
            a.healthy = False
            await wait_until(lambda: not pool.replicas[0].up, what="the health check marks a down")
            pool.add_replica(b.url)
            assert (await pool.generate("s", _req())).replica == b.url
            a.healthy = True
            await wait_until(lambda: all(r.up for r in pool.replicas), what="the health check marks a up")
            pool.remove_replica(b.url)
            assert (await pool.generate("s", _req())).replica == a.url


async def test_shared_pools_one_per_replica_set_reference_counted(tok):
    async with ScriptedVLLM(tok) as a, ScriptedVLLM(tok) as b:
        shared = SharedPools(lambda urls: ReplicaPool(urls, health_interval_s=None), linger_s=0)
        p1 = shared.acquire([a.url, b.url])
        assert shared.acquire([b.url + "/", a.url]) is p1  # same set: same pool, whatever the order
        p2 = shared.acquire([a.url])
        assert p2 is not p1 and [n for _, n in shared.pools()] == [2, 1]
        await p1.generate("s", _req())
        await shared.release(p1)
        assert [n for _, n in shared.pools()] == [1, 1]
        await shared.release(p1)
        assert [pool for pool, _ in shared.pools()] == [p2]  # the last release closed it
        assert shared.acquire([a.url, b.url]) is not p1  # a fresh pool for the set
        await shared.close()
        assert shared.pools() == []
        for bad in ([], ["http://h:99999"], ["ftp://h:1"], ["http://h:1/v1"], [3]):
            with pytest.raises(ValueError):
                shared.acquire(bad)


async def test_an_unused_shared_pool_lingers_with_its_health_marks(tok):
    async with ScriptedVLLM(tok) as a:
        shared = SharedPools(lambda urls: ReplicaPool(urls, health_interval_s=None), linger_s=0.3)
        pool = shared.acquire([a.url])
        pool.replicas[0].up = False
        await shared.release(pool)
        again = shared.acquire([a.url])  # within linger_s: the same pool, marks kept
        assert again is pool and not pool.replicas[0].up
        await shared.release(again)
        await wait_until(lambda: shared.pools() == [], what="the pool closed after linger_s")


async def test_sessions_opened_one_after_another_spread_and_stick(tok):
    """No turn overlaps another, so in-flight counts are all 0: the sessions stuck to each
    replica break the tie, not the order the replicas were added in."""
    doubles = [ScriptedVLLM(tok) for _ in range(4)]
    for d in doubles:
        await d.start()
    try:
        async with _pool(*doubles) as pool:
            first = [(await pool.generate(f"s{i}", _req())).replica for i in range(16)]
            assert sorted(first.count(d.url) for d in doubles) == [4, 4, 4, 4]
            again = [(await pool.generate(f"s{i}", _req())).replica for i in range(16)]
            assert again == first  # sticky
            pool.forget("s0")
            assert sum(r.sessions for r in pool.replicas) == 15
    finally:
        for d in doubles:
            await d.stop()


def test_replica_url_rules():
    assert replica_url("http://h:8000/") == "http://h:8000"
    assert replica_url("https://[fd00::1]:8001") == "https://[fd00::1]:8001"
    for bad in (
        "http://h:99999",
        "http://h:0",
        "http://h:x",
        "http://",
        "h:1",
        "http://h/v1",
        "http://h?a=1",
    ):
        with pytest.raises(ValueError):
            replica_url(bad)


async def test_a_hung_replica_is_cancelled_at_its_deadline(tok, tiny_model_dir):
    """No health polling: the deadline alone (grace + slack * max_tokens / observed rate)
    cancels the call on the SIGSTOPped replica and the turn is replayed on the other."""
    async with double_process(tiny_model_dir, text="from a", delay_s=0.2) as a, ScriptedVLLM(tok) as b:
        b.default = Reply("from b")
        pool = ReplicaPool(
            [a.url, b.url], health_interval_s=None, deadlines=Deadlines(grace_s=1.0, slack=2.0, max_s=120)
        )
        async with pool:
            first = await pool.generate("s", _req(max_tokens=8))
            rep_a = pool.replicas[0]
            assert first.replica == a.url and rep_a.tokens_per_s is not None
            deadline = pool.deadlines.deadline_s(8, rep_a.tokens_per_s)
            assert 1.0 < deadline < 120
            a.stop()
            gen = await asyncio.wait_for(pool.generate("s", _req(max_tokens=8)), 60)
            assert gen.replica == b.url and not rep_a.up and rep_a.failures == 1
            expected = tok.encode("from b", add_special_tokens=False) + [tok.eos_token_id]
            assert gen.token_ids == expected and b.requests[0]["prompt"] == PROMPT
            assert gen.logprobs == [fake_logprob(t, len(PROMPT) + i) for i, t in enumerate(expected)]


def test_deadline_rule():
    d = Deadlines(grace_s=10, slack=3, max_s=100)
    assert d.deadline_s(64, None) == 100  # nothing observed yet
    assert d.deadline_s(64, 32.0) == 10 + 3 * 2
    assert d.deadline_s(10_000, 1.0) == 100


async def test_a_turn_no_replica_can_serve_is_held_until_one_comes_back(tok):
    """The only replica dies: the turn waits (on_hold once) instead of failing, and is served
    when the health loop sees the replica again; the record is the one generation."""
    async with ScriptedVLLM(tok, default=Reply("back again")) as a:
        port = a.port
        await a.stop()
        held: list[float] = []
        async with _pool(a, health_interval_s=0.05, outage_hold_s=30, outage_retry_s=0.1) as pool:
            started = asyncio.get_running_loop().time()
            turn = asyncio.create_task(pool.generate("s", _req(), on_hold=lambda: held.append(1)))
            await asyncio.sleep(0.6)
            assert not turn.done() and held == [1]  # held, not failed
            await a.start(port)
            gen = await asyncio.wait_for(turn, 10)
            waited = asyncio.get_running_loop().time() - started
        assert gen.replica == a.url and gen.token_ids[:-1] == tok.encode(
            "back again", add_special_tokens=False
        )
        assert waited >= 0.6 and len(a.requests) == 1 and held == [1]


async def test_past_the_hold_the_turn_fails_and_a_zero_hold_fails_at_once(tok):
    async with ScriptedVLLM(tok) as a:
        await a.stop()
        loop = asyncio.get_running_loop()
        async with _pool(
            a, outage_hold_s=0.5, outage_retry_s=0.1
        ) as pool:  # no health loop: it probes itself
            started = loop.time()
            with pytest.raises(ReplicaUnreachable, match=r"within 0\.5 s") as exc:
                await pool.generate("s", _req())
            assert 0.5 <= loop.time() - started < 3 and a.url in str(exc.value)
        async with _pool(a, outage_hold_s=0) as pool:
            started = loop.time()
            with pytest.raises(ReplicaUnreachable):
                await pool.generate("s", _req())
            assert loop.time() - started < 0.5
    with pytest.raises(ValueError):
        ReplicaPool([], outage_retry_s=0)


async def test_a_busy_replica_is_not_marked_down_by_a_missed_health_probe(tok):
    """A call in flight and /health unanswered (a long prefill stalls the server): the mark
    stays up for busy_grace_s and the turn finishes on that replica; past the grace, or with
    nothing in flight, silence marks it down; an error status marks it down at once."""
    async with ScriptedVLLM(tok, default=Reply("slow", delay_s=1.0)) as a:
        a.health_delay_s = 2.0
        async with _pool(a, health_interval_s=0.1, health_timeout_s=0.1, busy_grace_s=30) as pool:
            gen = await pool.generate("s", _req())
            assert gen.replica == a.url and pool.replicas[0].up and pool.replicas[0].failures == 0
            await asyncio.sleep(0.5)  # idle now: the first silent probe marks it down
            assert not pool.replicas[0].up
        a.default = Reply("slow", delay_s=1.5)
        async with _pool(a, health_interval_s=0.1, health_timeout_s=0.1, busy_grace_s=0.3) as pool:
            with pytest.raises(ReplicaUnreachable, match="marked down while generating"):
                await pool.generate("s", _req())  # silent for longer than the grace: down (hung)
        a.health_delay_s, a.healthy = 0.0, False
        async with _pool(a, health_interval_s=0.1, busy_grace_s=30) as pool:
            with pytest.raises(ReplicaUnreachable, match="marked down while generating"):
                await pool.generate("s", _req())  # it answered 503: down at once
