"""Finishing a trial after its worker died at turn k = N/2: resume by replay vs restart from scratch.

Both in the same run, alternating, on the same proxy: an N-turn tool-calling agent over the
proxy's OpenAI route; its tool runs a real shell command (`bash -c` in a scratch directory,
standing in for the sandbox) whose output depends on what earlier turns did. The model is the
scripted vLLM double with a fixed generation time per turn (`--gen-delay-s`, a stand-in for a
GPU's decode time; the double's reply is a function of the prompt, so every run makes the
same turns). Attempt 1 is cut after turn k-1 (its checkpoints are all that is left); then

- restart: a new session, all N turns generated;
- replay:  a new session seeded with attempt 1's checkpoints (proxy.replay), turns 1..k-1
  answered from the record, k..N generated.

Reported per mode (median of `--repeats`): wall seconds to finish, generations the backend
answered, backend tokens (prompt + generated over the generated turns: what the replicas
processed), and the ratio replay / restart. Prints one JSON document.

    .venv/bin/python bench/resume_replay.py [--turns 16] [--gen-delay-s 0.5] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy.checkpoint import MemorySink  # noqa: E402
from proxy.replay import ReplayRecord  # noqa: E402
from proxy.server import ProxyServer  # noqa: E402
from proxy.session import SessionConfig  # noqa: E402
from proxy.trajectory import Trajectory  # noqa: E402
from tests.doubles.scripted_vllm import Reply, ScriptedVLLM  # noqa: E402

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "shell",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]
# a coding agent's system prompt is long; this one is ~2K tokens in the tiny tokenizer
SYSTEM = "You are a coding agent working in a repository. " * 200


def model(delay_s: float):
    def reply(prompt: str) -> Reply:
        h = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        command = f"echo {h} >> steps; ls; cat steps; wc -l < steps"
        text = f'<tool_call>\n{{"name": "shell", "arguments": {{"command": "{command}"}}}}\n</tool_call>'
        return Reply(text, delay_s=delay_s)

    return reply


async def agent(base: str, turns: int, workdir: Path) -> None:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix the bug"}]
    async with aiohttp.ClientSession() as http:
        for _ in range(turns):
            body = {"model": "m", "messages": messages, "tools": TOOLS}
            async with http.post(f"{base}/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                message = (await resp.json())["choices"][0]["message"]
            call = message["tool_calls"][0]
            command = json.loads(call["function"]["arguments"])["command"]
            proc = await asyncio.create_subprocess_shell(
                command, cwd=workdir, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
            )
            out, _ = await proc.communicate()
            messages += [
                {"role": "assistant", "content": message["content"], "tool_calls": message["tool_calls"]},
                {"role": "tool", "tool_call_id": call["id"], "content": out.decode()},
            ]


async def attempt(srv, dbl, turns: int, replay: ReplayRecord | None, sink=None) -> dict:
    config = SessionConfig(
        model="m", max_context_tokens=200_000, id_seed="trial-bench", replay=replay, checkpoint=sink
    )
    handle = srv.open_session(config)
    answered = dbl.answered
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        await agent(handle.openai_base_url, turns, Path(work))
    seconds = time.perf_counter() - started
    traj = await srv.close_session(handle.session_id)
    live = [t for t in traj.turns if t.source == "generated"]
    return {
        "seconds": seconds,
        "generations": dbl.answered - answered,
        "backend_tokens": sum(t.prompt_tokens + t.completion_tokens for t in live),
        "replayed_turns": traj.counters.replayed,
        "session_id": handle.session_id,
        "trajectory": traj,
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=16)
    ap.add_argument("--gen-delay-s", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n, k = args.turns, args.turns // 2

    from trialflow.tinymodel import build_tokenizer

    tok = build_tokenizer(Path(tempfile.gettempdir()) / "trialflow-bench-tokenizer")
    async with ScriptedVLLM(tok, default=model(args.gen_delay_s), max_model_len=400_000) as dbl:
        async with ProxyServer(tokenizer=tok, replicas=[dbl.url], defaults=SessionConfig(model="m")) as srv:
            # attempt 1: cut after turn k-1 (the worker died while turn k was generated)
            sink = MemorySink()
            lost = await attempt(srv, dbl, k - 1, None, sink)
            record = ReplayRecord.from_trajectory(
                Trajectory.from_checkpoints(sink.payloads[lost["session_id"]])
            )
            runs: dict[str, list[dict]] = {"restart": [], "replay": []}
            for i in range(args.repeats):
                order = ("restart", "replay") if i % 2 == 0 else ("replay", "restart")
                for mode in order:
                    runs[mode].append(await attempt(srv, dbl, n, record if mode == "replay" else None))
                    print(f"{mode} {i}: {runs[mode][-1]['seconds']:.2f} s", file=sys.stderr)
    same = all(
        [s.response_ids.tolist() for s in a["trajectory"].segments]
        == [s.response_ids.tolist() for s in b["trajectory"].segments]
        for a, b in zip(runs["restart"], runs["replay"], strict=True)
    )

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[mode])

    out = {
        "turns": n,
        "crash_at_turn": k,
        "gen_delay_s": args.gen_delay_s,
        "repeats": args.repeats,
        "same_trajectory": same,
    }
    for mode in runs:
        out[mode] = {
            key: med(mode, key) for key in ("seconds", "generations", "backend_tokens", "replayed_turns")
        }
    out["ratio_replay_over_restart"] = {
        key: out["replay"][key] / out["restart"][key] for key in ("seconds", "generations", "backend_tokens")
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
