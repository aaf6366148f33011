"""Replay mode: a session answers from an earlier attempt's record while the requests match it.

The scripted vLLM double plays the model, deterministically (its reply is a function of the
prompt, so a replayed run and an uninterrupted one get the same tokens) and counts the
generations it answers. A small multi-turn agent (`_agent`) runs a shell-like tool whose output
the test controls, so a divergence can be injected at a chosen turn.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from proxy import ids
from proxy.chat import ChatRequest
from proxy.checkpoint import MemorySink
from proxy.errors import ReplayDiverged
from proxy.replay import ReplayRecord, describe
from proxy.session import Session, SessionConfig
from proxy.trajectory import Trajectory
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM
from tests.proxy._support import OPENAI_TOOLS, pool_over, proxy_server, token_view

SYSTEM = {"role": "system", "content": "You are a coding agent."}
N = 6
FIXTURES = Path(__file__).parent / "fixtures" / "trajectory_format1"


def _reply(prompt: str) -> Reply:
    """A tool call whose command depends on the whole prompt (deterministic)."""
    h = hashlib.sha256(prompt.encode()).hexdigest()[:8]
    call = f'<tool_call>\n{{"name": "Bash", "arguments": {{"command": "echo {h}"}}}}\n</tool_call>'
    return Reply(call, experts=(2, 2, 8))


def _tool_output(turn: int, command: str) -> str:
    return f"ran {command!r} at step {turn}"


async def _agent(session: Session, tool=_tool_output, turns: int = N) -> list:
    """`turns` requests: each answer's tool call is run by `tool` and its output sent back."""
    messages = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    outcomes = []
    for t in range(turns):
        req = ChatRequest(protocol="openai", messages=list(messages), tools=OPENAI_TOOLS)
        out = await session.run_turn(req)
        outcomes.append(out)
        call = out.parsed.tool_calls[0]
        messages.append(
            {
                "role": "assistant",
                "content": out.parsed.content,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": tool(t, call.arguments["command"])}
        )
    return outcomes


_OPEN: list[Session] = []


@pytest.fixture(autouse=True)
async def _close_pools():
    yield
    while _OPEN:
        await _OPEN.pop().pool.close()


def _session(tok, dbl, **cfg) -> Session:
    cfg.setdefault("model", "scripted")
    cfg.setdefault("max_context_tokens", 8192)
    cfg.setdefault("id_seed", "trial-x")
    session = Session(f"s{len(_OPEN)}", SessionConfig(**cfg), tok, pool_over(dbl.url))
    _OPEN.append(session)
    return session


async def _recorded_run(tok, dbl, **cfg):
    sink = MemorySink()
    s = _session(tok, dbl, checkpoint=sink, **cfg)
    outcomes = await _agent(s)
    await s.close()
    return s.trajectory, sink.payloads[s.id], outcomes


async def test_crash_at_turn_k_replays_turns_before_it_and_ends_token_exact(tok):
    k = 4  # the attempt died during turn k (1-based): its checkpoints hold turns 1..k-1
    async with ScriptedVLLM(tok, default=_reply) as dbl:
        full, payloads, _ = await _recorded_run(tok, dbl)
        assert dbl.answered == N
        lost = Trajectory.from_checkpoints(payloads[: k - 1])
        record = ReplayRecord.from_trajectory(lost)
        assert len(record.turns) == record.recorded_turns == k - 1

        dbl.answered = 0
        resumed = _session(tok, dbl, replay=record)
        messages_seen = []
        orig_run = resumed.run_turn

        async def counting(req, **kw):
            out = await orig_run(req, **kw)
            messages_seen.append(dbl.answered)
            return out

        resumed.run_turn = counting  # type: ignore[method-assign]
        await _agent(resumed)
    # turns 1..k-1 were answered without calling the double; k..N were generated
    assert messages_seen[: k - 1] == [0] * (k - 1)
    assert dbl.answered == N - (k - 1)
    t = resumed.trajectory
    assert [r.source for r in t.turns] == ["replayed"] * (k - 1) + ["generated"] * (N - k + 1)
    assert t.counters.replayed == k - 1 and t.counters.turns == N
    assert token_view(t) == token_view(full)  # token for token, experts included
    assert len(t.segments) == 1  # live turns extended the replayed segment
    status = t.metadata["replay"]
    assert status["replayed"] == k - 1 and status["divergence"]["reason"] == "record ended"
    assert status["divergence"]["turn"] == k - 1


async def test_a_full_record_replays_every_turn_with_identical_answers(tok):
    async with ScriptedVLLM(tok, default=_reply) as dbl:
        full, _, outcomes = await _recorded_run(tok, dbl)
        dbl.answered = 0
        again = _session(tok, dbl, replay=ReplayRecord.from_trajectory(full), replay_live=False)
        replayed = await _agent(again)
    assert dbl.answered == 0
    assert [(o.response_id, o.parsed, o.finish_reason, o.created) for o in replayed] == [
        (o.response_id, o.parsed, o.finish_reason, o.created) for o in outcomes
    ]
    assert all(o.replayed for o in replayed) and not any(o.replayed for o in outcomes)
    assert token_view(again.trajectory) == token_view(full)
    assert again.trajectory.metadata["replay"]["divergence"] is None


async def test_a_changed_tool_output_at_turn_j_goes_live_from_j_and_the_record_is_exact(tok):
    j = 3  # 0-based request index whose prompt first carries the changed output

    def changed(turn: int, command: str) -> str:
        return _tool_output(turn, command) + (" (clock moved)" if turn == j - 1 else "")

    async with ScriptedVLLM(tok, default=_reply) as dbl:
        full, _, _ = await _recorded_run(tok, dbl)
        dbl.answered = 0
        resumed = _session(tok, dbl, replay=ReplayRecord.from_trajectory(full))
        await _agent(resumed, tool=changed)
        assert dbl.answered == N - j
        # the same changed environment, all live: what the record must equal
        live = _session(tok, dbl)
        await _agent(live, tool=changed)
    t = resumed.trajectory
    assert [r.source for r in t.turns] == ["replayed"] * j + ["generated"] * (N - j)
    assert token_view(t) == token_view(live.trajectory)
    assert len(t.segments) == 1  # the recorded prefix held: same segment, extended live
    div = resumed.replayer.divergence
    assert (div.turn, div.reason, div.recorded_turn) == (j, "prompt differs", j)
    assert t.metadata["replay"]["divergence"]["first_diff_token"] == div.first_diff
    text = describe(div, lambda ids_: tok.decode(list(ids_), skip_special_tokens=False))
    assert f"request {j} differs from recorded turn {j}" in text
    assert "+" in text and "(clock moved)" in text


async def test_model_free_replay_refuses_the_first_divergent_request(tok):
    async with ScriptedVLLM(tok, default=_reply) as dbl:
        full, _, _ = await _recorded_run(tok, dbl)
        dbl.answered = 0
        s = _session(tok, dbl, replay=ReplayRecord.from_trajectory(full), replay_live=False)
        with pytest.raises(ReplayDiverged, match="request 2: prompt differs"):
            await _agent(s, tool=lambda t, c: _tool_output(t, c) + ("!" if t == 1 else ""))
        # and past the end of a record
        s2 = _session(tok, dbl, replay=ReplayRecord.from_trajectory(full), replay_live=False)
        with pytest.raises(ReplayDiverged, match=f"request {N}: record ended"):
            await _agent(s2, turns=N + 1)
    assert dbl.answered == 0
    assert s.trajectory.counters.turns == 2 and s.replayer.divergence.turn == 2


async def test_ids_derive_from_seed_and_turn(tok):
    async with ScriptedVLLM(tok, default=_reply) as dbl:
        a = await _agent(_session(tok, dbl, id_seed="trial-1"), turns=2)
        b = await _agent(_session(tok, dbl, id_seed="trial-1"), turns=2)
        c = await _agent(_session(tok, dbl, id_seed="trial-2"), turns=2)
    assert [o.response_id for o in a] == [o.response_id for o in b] != [o.response_id for o in c]
    assert [o.parsed.tool_calls[0].id for o in a] == [o.parsed.tool_calls[0].id for o in b]
    assert a[0].parsed.tool_calls[0].id == ids.tool_call_ids("openai", "trial-1", 0)()
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{32}", a[0].response_id)
    assert re.fullmatch(r"call_[0-9a-f]{24}", a[0].parsed.tool_calls[0].id)
    assert re.fullmatch(r"msg_[0-9a-f]{24}", ids.response_id("anthropic", "s", 3))
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", ids.tool_call_ids("anthropic", "s", 3)())


def test_records_written_before_answers_replay_nothing():
    old = Trajectory.from_bytes((FIXTURES / "full.npz").read_bytes())
    record = ReplayRecord.from_trajectory(old)
    assert (len(record.turns), record.recorded_turns) == (0, 4)
    assert all(r.source == "generated" and r.answer is None for r in old.turns)


def _strip_keepalives(body: bytes) -> bytes:
    body = re.sub(rb"event: ping\ndata: [^\n]*\n\n", b"", body)
    return re.sub(rb"^: [^\n]*\n\n", b"", body, flags=re.M)


async def _http_agent(base: str, protocol: str, stream: bool, turns: int = 3) -> list[bytes]:
    """A raw-HTTP client of the proxy: returns each answer's bytes (keep-alives removed)."""
    bodies = []
    messages: list = [{"role": "user", "content": "fix the bug"}]
    async with aiohttp.ClientSession() as http:
        for t in range(turns):
            if protocol == "openai":
                url = f"{base}/v1/chat/completions"
                body = {
                    "model": "m",
                    "messages": [SYSTEM, *messages],
                    "tools": OPENAI_TOOLS,
                    "stream": stream,
                }
            else:
                url = f"{base}/v1/messages"
                tools = [{"name": "Bash", "input_schema": OPENAI_TOOLS[0]["function"]["parameters"]}]
                body = {
                    "model": "m",
                    "system": SYSTEM["content"],
                    "messages": messages,
                    "tools": tools,
                    "max_tokens": 64,
                    "stream": stream,
                }
            async with http.post(url, json=body) as resp:
                raw = await resp.read()
                assert resp.status == 200, raw
            bodies.append(_strip_keepalives(raw))
            # the next request: the answer's tool call, by its id
            call_id, command = _call_of(raw, protocol, stream)
            if protocol == "openai":
                messages += [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": "Bash", "arguments": f'{{"command": "{command}"}}'},
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": call_id, "content": f"out {t}"},
                ]
            else:
                messages += [
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "tool_use", "id": call_id, "name": "Bash", "input": {"command": command}}
                        ],
                    },
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": call_id, "content": f"out {t}"}],
                    },
                ]
    return bodies


def _call_of(raw: bytes, protocol: str, stream: bool) -> tuple[str, str]:
    text = raw.decode()
    ident = re.search(r'"(call_[0-9a-f]{24}|toolu_[0-9a-f]{24})"', text).group(1)
    # the streamed arguments come in pieces: the non-streamed text or the tool's fixed stand-in
    found = re.search(r"echo [0-9a-f]{8}", text)
    return ident, found.group(0) if found and not stream else "ls"


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [False, True])
async def test_replayed_answers_are_byte_identical_over_http(tok, protocol, stream):
    async with ScriptedVLLM(tok, default=_reply) as dbl:
        async with proxy_server(tok, dbl.url, max_context_tokens=8192) as srv:
            first = srv.open_session(SessionConfig(model="scripted", max_context_tokens=8192, id_seed="t"))
            recorded = await _http_agent(first.anthropic_base_url, protocol, stream)
            record = ReplayRecord.from_trajectory(await srv.close_session(first.session_id))
            dbl.answered = 0
            second = srv.open_session(
                SessionConfig(model="scripted", max_context_tokens=8192, id_seed="t", replay=record)
            )
            replayed = await _http_agent(second.anthropic_base_url, protocol, stream)
            assert srv.session(second.session_id).trajectory.counters.replayed == 3
    assert dbl.answered == 0
    assert replayed == recorded


async def test_replayed_experts_rebuild_the_recorded_rows(tok):
    async with ScriptedVLLM(tok, default=_reply) as dbl:
        full, _, _ = await _recorded_run(tok, dbl)
        again = _session(tok, dbl, replay=ReplayRecord.from_trajectory(full), replay_live=False)
        await _agent(again)
    a, b = full.segments[0].routed_experts, again.trajectory.segments[0].routed_experts
    assert a is not None and a.dtype == b.dtype and np.array_equal(a, b)
