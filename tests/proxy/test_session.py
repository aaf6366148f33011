"""Session against the scripted vLLM double: the turn pipeline, its failure rules, checkpoints."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from proxy.chat import ChatRequest, SamplingParams
from proxy.checkpoint import DirectorySink, MemorySink
from proxy.errors import BudgetSpent, ContextExhausted, NotFound, ReplicaUnreachable, TurnLimitReached
from proxy.session import Session, SessionConfig
from proxy.trajectory import Trajectory
from tests._wait import wait_until
from tests.doubles.scripted_vllm import Abort, Reply, ScriptedVLLM, fake_experts, fake_logprob
from tests.proxy._support import BASH_TOOL_CALL, OPENAI_TOOLS, pool_over, token_view

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def _ids():
    n = iter(range(1000))
    return lambda: f"call_{next(n)}"


def _req(messages, max_tokens=None, stop=(), tools=OPENAI_TOOLS) -> ChatRequest:
    return ChatRequest(
        protocol="openai",
        messages=messages,
        tools=tools,
        sampling=SamplingParams(max_tokens=max_tokens, stop=stop),
    )


_OPEN: list[Session] = []


@pytest.fixture(autouse=True)
async def _close_pools():
    yield
    while _OPEN:
        await _OPEN.pop().pool.close()


def _session(tok, dbl, **cfg) -> Session:
    cfg.setdefault("model", "scripted")
    cfg.setdefault("max_context_tokens", 4096)
    session = Session("sess", SessionConfig(**cfg), tok, pool_over(dbl.url))
    _OPEN.append(session)
    return session


def _after_call(messages: list, outcome, result: str = "a.txt b.txt") -> list:
    """``messages`` + the assistant message echoing ``outcome``'s first tool call + its result."""
    call = outcome.parsed.tool_calls[0]
    echoed = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    return messages + [
        {"role": "assistant", "content": outcome.parsed.content, "tool_calls": [echoed]},
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]


async def _two_turns(session: Session):
    """user -> tool call; tool result -> final text. Returns both outcomes and the messages."""
    m1 = [SYSTEM, {"role": "user", "content": "list files"}]
    o1 = await session.run_turn(_req(m1), new_tool_call_id=_ids())
    o2 = await session.run_turn(_req(_after_call(m1, o1)), new_tool_call_id=_ids())
    return o1, o2


async def test_turn_pipeline_records_exact_tokens_and_extends(tok):
    async with ScriptedVLLM(tok, script=[Reply(BASH_TOOL_CALL), Reply("two files")]) as dbl:
        s = _session(tok, dbl, sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=1))
        o1, o2 = await _two_turns(s)
    assert o1.finish_reason == "tool_calls" and o1.parsed.tool_calls[0].arguments == {"command": "ls"}
    assert o2.finish_reason == "stop" and o2.parsed.content == "two files"
    (seg,) = s.trajectory.segments
    first, second = dbl.requests
    # Sampling comes from the session config; max_tokens is the context left.
    assert (first["temperature"], first["top_p"], first["top_k"], first["seed"]) == (0.7, 0.9, 5, 1)
    assert first["max_tokens"] == 4096 - len(first["prompt"])
    # Turn 2's prompt is turn 1's full sequence plus environment tokens.
    gen1 = tok.encode(BASH_TOOL_CALL, add_special_tokens=False) + [tok.eos_token_id]
    assert seg.prompt_ids.tolist() == first["prompt"]
    assert second["prompt"][: len(first["prompt"]) + len(gen1)] == first["prompt"] + gen1
    assert seg.full_ids[: len(second["prompt"])] == second["prompt"]
    # Mask marks exactly the generated tokens; logprobs are the backend's.
    gen_positions = [i for i, m in enumerate(seg.response_mask) if m]
    assert len(gen_positions) == o1.completion_tokens + o2.completion_tokens
    for i in gen_positions:
        pos = len(seg.prompt_ids) + i
        assert seg.response_logprobs[i] == pytest.approx(fake_logprob(seg.response_ids[i], pos), abs=1e-6)
    assert s.trajectory.counters.turns == 2 and s.trajectory.counters.tool_calls == 1


async def test_routed_experts_stored_per_token(tok):
    async with ScriptedVLLM(
        tok, script=[Reply(BASH_TOOL_CALL, experts=(2, 2, 8)), Reply("done", experts=(2, 2, 8))]
    ) as dbl:
        s = _session(tok, dbl)
        await _two_turns(s)
    (seg,) = s.trajectory.segments
    n = len(seg)
    assert seg.routed_experts.shape == (n, 2, 2)
    # Every row but the last (never forwarded) is the routing vLLM reported for that position.
    assert np.array_equal(seg.routed_experts[: n - 1].astype(np.int32), fake_experts(n - 1, 2, 2, 8))


async def test_abort_resume_is_one_turn(tok):
    part = tok.encode("<think>\nplan", add_special_tokens=False)
    rest = tok.encode("\n</think>\n\nanswer", add_special_tokens=False)
    async with ScriptedVLLM(tok, script=[Abort(token_ids=part), Reply(token_ids=rest)]) as dbl:
        s = _session(tok, dbl)
        out = await s.run_turn(_req([SYSTEM, {"role": "user", "content": "q"}]), new_tool_call_id=_ids())
    assert out.parsed.reasoning == "plan" and out.parsed.content == "answer"
    (turn,) = s.trajectory.turns
    assert turn.resumed_after_abort == 1 and s.trajectory.counters.aborts_resumed == 1
    assert s.trajectory.segments[0].response_ids.tolist() == part + rest + [tok.eos_token_id]


async def test_failed_turn_commits_nothing_then_recovers(tok):
    dbl = await ScriptedVLLM(tok, script=[Reply(BASH_TOOL_CALL), Reply("done")]).start()
    s = _session(tok, dbl)
    m1 = [SYSTEM, {"role": "user", "content": "list files"}]
    await s.run_turn(_req(m1), new_tool_call_id=_ids())
    before = token_view(s.trajectory), list(s.trajectory.turns)
    port = dbl.port
    await dbl.stop()
    with pytest.raises(ReplicaUnreachable):
        await s.run_turn(_req(m1 + [{"role": "user", "content": "more"}]), new_tool_call_id=_ids())
    assert (token_view(s.trajectory), list(s.trajectory.turns)) == before
    assert s.trajectory.counters.infra_errors == 1  # the agent saw infrastructure fail
    await dbl.start(port)  # the replica comes back: the same session continues
    out = await s.run_turn(
        _req(
            m1
            + [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "x",
                            "type": "function",
                            "function": {"name": "Bash", "arguments": {"command": "ls"}},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "x", "content": "ok"},
            ]
        ),
        new_tool_call_id=_ids(),
    )
    await dbl.stop()
    assert out.parsed.content == "done"
    assert len(s.trajectory.segments) == 1 and s.trajectory.counters.turns == 2


async def test_context_exhaustion_marks_overlong(tok):
    async with ScriptedVLLM(tok) as dbl:
        s = _session(tok, dbl, max_context_tokens=40)
        with pytest.raises(ContextExhausted) as exc:
            await s.run_turn(_req([SYSTEM, {"role": "user", "content": "x " * 100}]), new_tool_call_id=_ids())
    assert exc.value.status == 400 and "prompt is too long" in exc.value.message
    assert s.overlong and s.trajectory.counters.overlong == 1
    assert s.trajectory.segments == [] and dbl.requests == []


async def test_a_prompt_that_cannot_fit_is_refused_before_it_is_encoded(tok, monkeypatch):
    """A first prompt and an extension far over the limit: the same ContextExhausted as a
    prompt found too long after encoding (status, wording, counters, overlong flag), with its
    lower bound as the count, and the tokenizer never called; one just under the limit's bound
    is still encoded and refused by its exact count."""
    async with ScriptedVLLM(tok, script=[Reply("ok")]) as dbl:
        s = _session(tok, dbl, max_context_tokens=1000)
        encoded: list[int] = []
        encode = s.tracker._encode
        monkeypatch.setattr(s.tracker, "_encode", lambda text: encoded.append(len(text)) or encode(text))
        big = _req([SYSTEM, {"role": "user", "content": "x" * 40000}])
        exact = s.tracker.count_tokens(big)
        encoded.clear()
        with pytest.raises(ContextExhausted) as early:
            await s.run_turn(big, new_tool_call_id=_ids())
        assert encoded == [] and dbl.requests == [] and s.trajectory.segments == []
        assert early.value.status == 400 and early.value.max_context_tokens == 1000
        assert 1000 <= early.value.prompt_tokens <= exact
        assert early.value.message == f"prompt is too long: {early.value.prompt_tokens} tokens > 1000 maximum"
        assert s.overlong and s.trajectory.counters.overlong == 1
        # the late path (a prompt whose bound stays under the limit) gives the same error
        late_req = _req([SYSTEM, {"role": "user", "content": "x " * 1000}])
        with pytest.raises(ContextExhausted) as late:
            await s.run_turn(late_req, new_tool_call_id=_ids())
        assert encoded and late.value.prompt_tokens == s.tracker.count_tokens(late_req) > 1000
        assert type(late.value) is type(early.value) and late.value.error_type == early.value.error_type
        assert s.trajectory.counters.overlong == 2
        # an extension: the segment's tokens plus the new text's bound
        first = [SYSTEM, {"role": "user", "content": "q"}]
        await s.run_turn(_req(first), new_tool_call_id=_ids())
        encoded.clear()
        more = first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "y" * 40000}]
        with pytest.raises(ContextExhausted):
            await s.run_turn(_req(more), new_tool_call_id=_ids())
        assert encoded == [] and s.trajectory.counters.overlong == 3 and len(dbl.requests) == 1
        assert s.tracker.prepare(_req(more)).extends  # it was refused as the extension it is


async def test_context_limit_comes_from_the_backend(tok):
    async with ScriptedVLLM(tok, max_model_len=1000) as dbl:
        for configured in (None, 10**6):
            s = _session(tok, dbl, max_context_tokens=configured)
            await s.run_turn(_req([{"role": "user", "content": "q"}]), new_tool_call_id=_ids())
            assert dbl.requests[-1]["max_tokens"] == 1000 - len(dbl.requests[-1]["prompt"])
        s = _session(tok, dbl, max_context_tokens=None)
        with pytest.raises(ContextExhausted) as exc:
            await s.run_turn(_req([{"role": "user", "content": "word " * 1200}]), new_tool_call_id=_ids())
    assert exc.value.max_context_tokens == 1000


async def test_max_tokens_bounds_and_stop_sequence(tok):
    async with ScriptedVLLM(tok, script=[Reply("alpha END")]) as dbl:
        s = _session(tok, dbl, sampling=SamplingParams(max_tokens=50))
        out = await s.run_turn(
            _req([{"role": "user", "content": "q"}], max_tokens=30, stop=("END",)), new_tool_call_id=_ids()
        )
        assert dbl.requests[0]["max_tokens"] == 30 and dbl.requests[0]["stop"] == ["END"]
    assert out.stop_sequence is None and out.parsed.content == "alpha END"  # it ended on EOS
    # vLLM stopping on the string: no EOS, the string included (include_stop_str_in_output).
    async with ScriptedVLLM(tok, script=[Reply("alpha END", eos=False)]) as dbl:
        s = _session(tok, dbl)
        out = await s.run_turn(
            _req([{"role": "user", "content": "q"}], stop=("END",)), new_tool_call_id=_ids()
        )
    assert out.stop_sequence == "END" and out.parsed.content == "alpha"


async def test_concurrent_requests_wait_for_the_running_turn(tok):
    async with ScriptedVLLM(tok, default=Reply("slow", delay_s=0.4)) as dbl:
        s = _session(tok, dbl)
        a = asyncio.create_task(
            s.run_turn(_req([SYSTEM, {"role": "user", "content": "a"}]), new_tool_call_id=_ids())
        )
        await wait_until(lambda: s.busy, what="turn a running")
        b = await s.run_turn(_req([SYSTEM, {"role": "user", "content": "b"}]), new_tool_call_id=_ids())
        await a
    assert b.parsed.content == "slow" and s.trajectory.counters.turns == 2
    (a_in, a_out), (b_in, _) = dbl.timings
    assert b_in >= a_out  # the backend never saw both at once


async def test_checkpoints_after_every_turn_rebuild_the_trajectory(tok, tmp_path):
    mem, disk = MemorySink(), DirectorySink(tmp_path)

    class Both:
        fail_next = False

        async def write(self, session_id, seq, payload):
            if self.fail_next:
                self.fail_next = False
                raise OSError("bucket unavailable")
            await mem.write(session_id, seq, payload)
            await disk.write(session_id, seq, payload)

    sink = Both()
    async with ScriptedVLLM(tok, script=[Reply(BASH_TOOL_CALL), Reply("done")]) as dbl:
        s = _session(tok, dbl, checkpoint=sink, metadata={"trial_id": "t1"})
        m1 = [SYSTEM, {"role": "user", "content": "list files"}]
        await s.run_turn(_req(m1), new_tool_call_id=_ids())
        await s.flush_checkpoints()  # writes run in the background (see the next test)
        assert len(mem.payloads["sess"]) == 1
        assert Trajectory.from_checkpoints(mem.payloads["sess"]).to_bytes() == s.trajectory.to_bytes()
        sink.fail_next = True
        await s.run_turn(_req(m1 + [{"role": "user", "content": "again"}]), new_tool_call_id=_ids())
        await s.flush_checkpoints()
        assert s.checkpoint_failures == 1 and len(mem.payloads["sess"]) == 1
        await s.run_turn(_req(m1 + [{"role": "user", "content": "third"}]), new_tool_call_id=_ids())
        await s.flush_checkpoints()
    # The delta after the failure covers both turns: nothing is skipped.
    assert len(mem.payloads["sess"]) == 2 and s.trajectory.counters.turns == 3
    rebuilt = Trajectory.from_checkpoints(disk.read_all("sess"))
    assert rebuilt.to_bytes() == s.trajectory.to_bytes() and rebuilt.metadata["trial_id"] == "t1"


async def test_a_slow_checkpoint_sink_does_not_delay_the_answer(tok):
    """The answer comes back while the sink is still writing; the next turn and close() wait
    for the write, so writes never overlap and every turn is in the checkpoints."""
    writes: list[tuple[float, float, int]] = []

    class SlowSink:
        async def write(self, session_id, seq, payload):
            start = time.monotonic()
            await asyncio.sleep(0.5)
            writes.append((start, time.monotonic(), seq))
            await mem.write(session_id, seq, payload)

    mem = MemorySink()
    async with ScriptedVLLM(tok, script=[Reply("one"), Reply("two")]) as dbl:
        s = _session(tok, dbl, checkpoint=SlowSink())
        m1 = [SYSTEM, {"role": "user", "content": "q"}]
        t0 = time.monotonic()
        await s.run_turn(_req(m1), new_tool_call_id=_ids())
        answered = time.monotonic()
        assert answered - t0 < 0.5 and not writes  # answered before the write finished
        await s.run_turn(
            _req(m1 + [{"role": "assistant", "content": "one"}, {"role": "user", "content": "q2"}]),
            new_tool_call_id=_ids(),
        )
        assert len(writes) == 1  # turn 2 waited for turn 1's write
        t = await s.close()
    assert [seq for *_, seq in writes] == [0, 1] and writes[1][0] >= writes[0][1]
    assert Trajectory.from_checkpoints(mem.payloads["sess"]).to_bytes() == t.to_bytes()


async def test_closed_session_refuses(tok):
    async with ScriptedVLLM(tok) as dbl:
        s = _session(tok, dbl)
        await s.run_turn(_req([{"role": "user", "content": "q"}]), new_tool_call_id=_ids())
        t = await s.close()
        assert t.counters.turns == 1
        with pytest.raises(NotFound):
            await s.run_turn(_req([{"role": "user", "content": "q"}]), new_tool_call_id=_ids())


async def test_overlong_counts_only_context_cuts_and_policy_version_is_recorded(tok):
    long_reply = "word " * 200
    async with ScriptedVLLM(tok, script=[Reply(long_reply), Reply(long_reply)]) as dbl:
        s = _session(tok, dbl, max_context_tokens=4096, policy_version=7)
        # cut by the client's own max_tokens: a normal length finish, not overlong
        o1 = await s.run_turn(
            _req([SYSTEM, {"role": "user", "content": "q"}], max_tokens=5), new_tool_call_id=_ids()
        )
        assert o1.finish_reason == "length" and s.trajectory.counters.overlong == 0
        # cut by the context window: overlong
        prompt_len = len(dbl.requests[-1]["prompt"])
        s2 = _session(tok, dbl, max_context_tokens=prompt_len + 5, policy_version=7)
        o2 = await s2.run_turn(_req([SYSTEM, {"role": "user", "content": "q"}]), new_tool_call_id=_ids())
        assert o2.finish_reason == "length" and dbl.requests[-1]["max_tokens"] == 5
    assert s2.trajectory.counters.overlong == 1 and s2.trajectory.turns[0].overlong
    seg = s.trajectory.segments[0]
    assert (seg.policy_version_min, seg.policy_version_max) == (7, 7)


def test_session_body_sets_main_thread_and_policy_version():
    cfg = SessionConfig().with_overrides({"main_thread": "first_with_tools", "policy_version": 3})
    assert (cfg.main_thread, cfg.policy_version) == ("first_with_tools", 3)
    with pytest.raises(ValueError):
        SessionConfig().with_overrides({"main_thread": "whatever"})
    with pytest.raises(TypeError):
        SessionConfig().with_overrides({"policy_version": "7"})


async def test_turn_limit_refuses_agent_turns_past_it_and_records_only_real_ones(tok):
    """max_turns=1: the main turn is served, a tool-less side call (a title) is served and not
    counted, the next main turn and a tool-offering side call are refused with 400 before
    anything reaches the backend, and the record holds exactly the generated turns."""
    async with ScriptedVLLM(tok, script=[Reply(BASH_TOOL_CALL)], default=Reply("A title")) as dbl:
        s = _session(tok, dbl, max_turns=1)
        m1 = [SYSTEM, {"role": "user", "content": "list files"}]
        o1 = await s.run_turn(_req(m1), new_tool_call_id=_ids())
        title = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "list files"}]
        await s.run_turn(_req(title, tools=None), new_tool_call_id=_ids())
        call = o1.parsed.tool_calls[0]
        m2 = m1 + [
            {
                "role": "assistant",
                "content": o1.parsed.content,
                "tool_calls": [
                    {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
        ]
        with pytest.raises(TurnLimitReached) as exc:
            await s.run_turn(_req(m2), new_tool_call_id=_ids())
        sub_agent = [{"role": "system", "content": "You are a sub-agent."}, {"role": "user", "content": "go"}]
        with pytest.raises(TurnLimitReached):
            await s.run_turn(_req(sub_agent), new_tool_call_id=_ids())
        # a main-thread request without tools still counts (text agents have none)
        with pytest.raises(TurnLimitReached):
            await s.run_turn(_req(m2, tools=None), new_tool_call_id=_ids())
    assert exc.value.status == 400 and exc.value.error_type == "turn_limit_reached"
    assert "turn limit reached" in exc.value.message and "token" not in exc.value.message
    assert len(dbl.requests) == 2 and s.agent_turns == 1
    t = s.trajectory
    assert t.counters.turns == 2 and t.counters.turn_limited == 3
    assert [seg.kind for seg in t.segments] == ["main", "side"]
    # every recorded model token is one the backend generated
    assert sum(sum(seg.response_mask) for seg in t.segments) == sum(r.completion_tokens for r in t.turns)
    again = Trajectory.from_bytes(t.to_bytes())
    assert again.counters.turn_limited == 3


async def test_turn_limit_refuses_a_waiting_tool_request_without_waiting(tok):
    """Once the limit is spent, a request offering tools is refused at once, even while
    another turn holds the session (its refusal must not wait into an event stream)."""
    async with ScriptedVLLM(tok, script=[Reply("ok"), Reply("slow side", delay_s=1.0)]) as dbl:
        s = _session(tok, dbl, max_turns=1)
        await s.run_turn(_req([SYSTEM, {"role": "user", "content": "a"}]), new_tool_call_id=_ids())
        side = asyncio.create_task(
            s.run_turn(_req([{"role": "user", "content": "title?"}], tools=None), new_tool_call_id=_ids())
        )
        await wait_until(lambda: len(dbl.requests) == 2, what="the side call at the backend")
        assert s.busy
        with pytest.raises(TurnLimitReached):
            await s.run_turn(_req([SYSTEM, {"role": "user", "content": "b"}]), new_tool_call_id=_ids())
        assert s.busy  # refused while the side call still ran
        await side
    assert s.trajectory.counters.turn_limited == 1 and len(dbl.requests) == 2


def test_session_body_sets_max_turns():
    assert SessionConfig().with_overrides({"max_turns": 3}).max_turns == 3
    assert SessionConfig(max_turns=3).with_overrides({"max_turns": None}).max_turns is None
    for bad, err in ((0, ValueError), ("3", TypeError), (True, TypeError)):
        with pytest.raises(err):
            SessionConfig().with_overrides({"max_turns": bad})


async def _tool_loop_to_the_budget(s: Session, dbl: ScriptedVLLM) -> tuple[list, int]:
    """Turn 1 (a tool call) fits; turn 2 (a long text) is cut at the segment's budget. Returns
    the conversation as the client would continue it and the first prompt's length."""
    m1 = [SYSTEM, {"role": "user", "content": "list files"}]
    o1 = await s.run_turn(_req(m1), new_tool_call_id=_ids())
    first = len(dbl.requests[0]["prompt"])
    m2 = _after_call(m1, o1)
    o2 = await s.run_turn(_req(m2, max_tokens=10_000), new_tool_call_id=_ids())
    assert o2.finish_reason == "length"
    m3 = m2 + [{"role": "assistant", "content": o2.parsed.content}, {"role": "user", "content": "go on"}]
    return m3, first


@pytest.mark.parametrize("ends", [False, True], ids=["refuses-turn", "ends-session"])
async def test_the_segment_budget_caps_max_tokens_and_refuses_past_it(tok, ends):
    """max_response_tokens R: a segment holds its first prompt P plus at most R tokens (the
    model's and the tool outputs): the client's max_tokens is capped at P + R - prompt, the
    cut turn is overlong, the next extension is refused as too long in the same 400 as the
    context window's; with overlong_ends_session every later agent turn, also a compacted
    history (a new segment), is refused (BudgetSpent, a 400 no client retries) and a
    tool-less side call is still served."""
    budget = 60
    script = [Reply(BASH_TOOL_CALL), Reply("word " * 200)]
    async with ScriptedVLLM(tok, script=script, default=Reply("A title")) as dbl:
        s = _session(tok, dbl, max_response_tokens=budget, overlong_ends_session=ends)
        m3, first = await _tool_loop_to_the_budget(s, dbl)
        second = dbl.requests[1]
        assert second["max_tokens"] == first + budget - len(second["prompt"]) < 10_000
        (seg,) = s.trajectory.segments
        assert len(seg.prompt_ids) == first and len(seg.prompt_ids) + len(seg.response_ids) == first + budget
        assert s.trajectory.turns[1].overlong and s.trajectory.counters.overlong == 1
        if not ends:
            with pytest.raises(ContextExhausted) as refused:
                await s.run_turn(_req(m3), new_tool_call_id=_ids())
            assert f"> {first + budget} maximum" in refused.value.message
            assert s.trajectory.counters.overlong == 2
        else:
            compacted = [SYSTEM, {"role": "user", "content": "summary: listed files; go on"}]
            for request in (_req(m3), _req(compacted), _req(compacted, tools=None)):
                with pytest.raises(BudgetSpent) as spent:
                    await s.run_turn(request, new_tool_call_id=_ids())
            assert spent.value.status == 400 and spent.value.error_type == "budget_spent"
            for clue in ("too long", "context", "exceed", "limit"):  # nothing clients compact on
                assert clue not in spent.value.message
            title = [{"role": "system", "content": "Write a title."}, {"role": "user", "content": "x"}]
            await s.run_turn(_req(title, tools=None), new_tool_call_id=_ids())
            assert [x.kind for x in s.trajectory.segments] == ["main", "side"]
        assert len(dbl.requests) == 2 + ends  # nothing refused reached the backend


async def test_the_segment_budget_is_per_segment_and_the_context_bound_still_holds(tok):
    """A new segment gets its own first prompt + R; max_context_tokens bounds the total too."""
    async with ScriptedVLLM(tok, default=Reply("word " * 200)) as dbl:
        s = _session(tok, dbl, max_response_tokens=30)
        await s.run_turn(_req([SYSTEM, {"role": "user", "content": "one"}]), new_tool_call_id=_ids())
        side = [
            {"role": "system", "content": "Other."},
            {"role": "user", "content": "a longer side question here"},
        ]
        await s.run_turn(_req(side), new_tool_call_id=_ids())
        assert [r["max_tokens"] for r in dbl.requests] == [30, 30]
        first = len(dbl.requests[0]["prompt"])
        t = _session(tok, dbl, max_response_tokens=30, max_context_tokens=first + 12)
        await t.run_turn(_req([SYSTEM, {"role": "user", "content": "one"}]), new_tool_call_id=_ids())
        assert dbl.requests[-1]["max_tokens"] == 12


def test_session_body_sets_the_budget():
    cfg = SessionConfig().with_overrides({"max_response_tokens": 7, "overlong_ends_session": True})
    assert (cfg.max_response_tokens, cfg.overlong_ends_session) == (7, True)
    for body, err in (
        ({"max_response_tokens": 0}, ValueError),
        ({"max_response_tokens": "7"}, TypeError),
        ({"overlong_ends_session": 1}, TypeError),
    ):
        with pytest.raises(err):
            SessionConfig().with_overrides(body)


async def test_closing_a_session_cancels_its_turn_held_for_an_outage(tok):
    """The agent is stopped (its timeout) while its turn waits for a replica: close() does not
    wait out the hold; the turn fails and counts as an infrastructure error the agent saw."""
    async with ScriptedVLLM(tok) as dbl:
        await dbl.stop()
        s = Session("sess", SessionConfig(model="scripted"), tok, pool_over(dbl.url, outage_hold_s=60))
        _OPEN.append(s)
        turn = asyncio.create_task(
            s.run_turn(_req([SYSTEM, {"role": "user", "content": "a"}]), new_tool_call_id=_ids())
        )
        await asyncio.sleep(0.5)  # no max_context_tokens: held for the replicas' max_model_len first
        assert not turn.done() and s.trajectory.counters.outage_holds == 1
        started = time.monotonic()
        t = await asyncio.wait_for(s.close(), 5)
        assert time.monotonic() - started < 2
        with pytest.raises(ReplicaUnreachable, match="closed while its turn waited"):
            await turn
    assert (t.counters.turns, t.counters.outage_holds, t.counters.infra_errors) == (0, 1, 1)
    again = Trajectory.from_bytes(t.to_bytes())
    assert (again.counters.outage_holds, again.counters.infra_errors) == (1, 1)


async def test_closing_a_session_cuts_its_generation_and_keeps_what_was_answered(tok):
    """The agent is stopped (its timeout) during a slow turn: close() does not wait for the
    generation. Its call is cancelled and its connection to the replica closed (the double,
    as vLLM, stops generating then), nothing of the unfinished turn is recorded, and the turn
    answered before it stays, checkpointed. Not an infrastructure error: the attempt is the
    agent's to verify."""
    sink = MemorySink()
    slow = Reply("word " * 50, delay_s=120)
    async with ScriptedVLLM(tok, script=[Reply("first answer"), slow], default=slow) as dbl:
        s = _session(tok, dbl, checkpoint=sink)
        messages = [SYSTEM, {"role": "user", "content": "a"}]
        first = await s.run_turn(_req(messages), new_tool_call_id=_ids())
        messages += [{"role": "assistant", "content": first.parsed.content}, {"role": "user", "content": "b"}]
        turn = asyncio.create_task(s.run_turn(_req(messages), new_tool_call_id=_ids()))
        await wait_until(lambda: len(dbl.requests) == 2, what="the second turn reached the replica")
        t = await asyncio.wait_for(s.close(), 10)  # the generation would take 120 s
        with pytest.raises(NotFound, match="closed while its turn was generating"):
            await turn
        await wait_until(lambda: dbl.client_gone == 1, what="the replica saw its client go away")
        assert dbl.answered == 1
    assert (t.counters.turns, t.counters.closed_mid_turn, t.counters.infra_errors) == (1, 1, 0)
    assert t.turns[0].completion_tokens == len(tok.encode("first answer", add_special_tokens=False)) + 1
    again = Trajectory.from_bytes(t.to_bytes())
    assert (again.counters.turns, again.counters.closed_mid_turn) == (1, 1)
    assert Trajectory.from_checkpoints(sink.payloads["sess"]).counters.turns == 1  # checkpointed


async def test_a_turn_prepared_after_close_began_generates_nothing(tok):
    """close() began while a turn was still being prepared: the turn never starts its call."""
    async with ScriptedVLLM(tok) as dbl:
        s = _session(tok, dbl)
        gate = asyncio.Event()

        async def offload(step):
            await gate.wait()
            return step()

        turn = asyncio.create_task(
            s.run_turn(_req([SYSTEM, {"role": "user", "content": "a"}]), offload=offload)
        )
        await asyncio.sleep(0)
        closing = asyncio.create_task(s.close())
        await asyncio.sleep(0.05)
        gate.set()
        t = await asyncio.wait_for(closing, 10)
        with pytest.raises(NotFound, match="closed before its turn was generated"):
            await turn
        assert dbl.requests == [] and (t.counters.turns, t.counters.closed_mid_turn) == (0, 1)
