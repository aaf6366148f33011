"""Memory held per open proxy session whose trajectory has reached ~32K tokens.

``--sessions`` sessions are opened on a real ``ProxyServer`` (in this process) and driven
turn by turn through ``Session.run_turn`` (the code path behind both protocol routes, minus
HTTP) until each holds about ``--tokens`` tokens: a ~2K-token system prompt, then turns of a
~100-token user message and a ~``--reply-tokens``-token reply. The backend is
``tests.doubles.scripted_vllm.ScriptedVLLM`` (a TEST DOUBLE of vLLM's ``/v1/completions``)
in a separate process, so its request log does not count here.

Two passes, each building ``--sessions`` sessions (the client's own message lists are
dropped and ``gc.collect()`` runs before measuring):

1. RSS (``VmRSS``) after minus before, without tracemalloc (its per-allocation bookkeeping
   would inflate RSS); the sessions are then closed;
2. ``tracemalloc`` traced bytes after minus before, plus the allocation sites (file:line)
   that gained the most, so the cost can be attributed.

Both are divided by the number of sessions. RSS includes allocator slack and is an upper
bound; tracemalloc counts Python-heap bytes only (numpy buffers are traced too). Baseline: the raw token arrays of the same
trajectories (full ids as int32, response mask as int8, response logprobs as float32),
so the ratio says how much the in-memory representation costs over packed arrays. For
reference the compressed npz checkpoint size (``Trajectory.to_bytes()``) is reported too.

After pass 2, ``holders_bytes_per_session`` attributes by owner rather than allocation site:
``sys.getsizeof`` summed over what the session's trajectory token arrays, its trajectory,
its ``tracker`` (minus the trajectory) and the whole ``Session`` reach (containers, strings,
numbers, arrays, instance dicts; not functions, types, or the tokenizer and replica pool
that all sessions share). An object reachable from two sessions is counted in each.

``--json-roundtrip`` passes every request's messages through ``json.dumps``/``json.loads``
first, as the HTTP routes hand the session a freshly parsed body per request: the strings
the tracker keeps are then the session's own, not shared with the client (the default
shares them, which is how the "before" numbers in docs/benchmarks.md were measured).

    .venv/bin/python bench/session_memory.py [--sessions 16] [--tokens 32768] [--reply-tokens 2000] [--top 8]
                                             [--json-roundtrip]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import sys
import time
import tracemalloc
import types
from array import array
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from proxy_overhead import TOKENIZER_DIR, sized_text, spawn  # noqa: E402 - after the sys.path line


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def raw_array_bytes(trajectory) -> int:
    """int32 ids + int8 mask + float32 logprobs for every segment."""
    return sum(
        4 * len(s) + 1 * len(s.response_mask) + 4 * len(s.response_logprobs) for s in trajectory.segments
    )


def deep_bytes(root: object, seen: set[int]) -> int:
    """``sys.getsizeof`` summed over the objects reachable from ``root`` through containers
    and instance dicts, each once; objects whose id is in ``seen`` are skipped (and every
    object visited is added to it). Functions, types and modules are not followed."""
    total, stack = 0, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType, types.MethodType)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif not isinstance(obj, (str, bytes, int, float, array)) and hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return total


def holders(session, shared: set[int]) -> dict[str, int]:
    """Bytes per owner of one session (see the module docstring)."""
    traj = session.trajectory
    token_arrays = [
        a for s in traj.segments for a in (s.prompt_ids, s.response_ids, s.response_mask, s.response_logprobs)
    ]
    return {
        "trajectory_token_arrays": sum(sys.getsizeof(a) for a in token_arrays),
        "trajectory_all": deep_bytes(traj, set(shared)),
        "tracker_without_trajectory": deep_bytes(session.tracker, shared | {id(traj)}),
        "session_all": deep_bytes(session, set(shared)),
    }


async def build(args: argparse.Namespace, backend_url: str) -> dict:
    from proxy.chat import ChatRequest
    from proxy.server import ProxyServer
    from trialflow.tinymodel import build_tokenizer

    tok = build_tokenizer(TOKENIZER_DIR)
    server = ProxyServer(tokenizer=tok, replicas=[backend_url])
    await server.start()
    ids = itertools.count()
    try:
        # Warm up code paths and caches (first render, first HTTP connection) outside the count.
        warm = server.open_session()
        await server.session(warm.session_id).run_turn(
            ChatRequest(protocol="openai", messages=[{"role": "user", "content": "hi"}]),
            new_tool_call_id=lambda: f"call_{next(ids)}",
        )
        await server.close_session(warm.session_id)
        system = sized_text(tok, 2000, salt=1)
        users = [sized_text(tok, 100, salt=10 + t) for t in range(200)]

        async def fill(tag: str) -> list:
            handles = []
            for i in range(args.sessions):
                handle = server.open_session()
                handles.append(handle)
                session = server.session(handle.session_id)
                messages = [{"role": "system", "content": f"{tag} session {i}. {system}"}]
                t = 0
                while sum(len(s) for s in session.trajectory.segments) < args.tokens and t < len(users):
                    messages.append({"role": "user", "content": users[t]})
                    sent = json.loads(json.dumps(messages)) if args.json_roundtrip else list(messages)
                    outcome = await session.run_turn(
                        ChatRequest(protocol="openai", messages=sent),
                        new_tool_call_id=lambda: f"call_{next(ids)}",
                    )
                    del sent
                    messages.append({"role": "assistant", "content": outcome.parsed.content})
                    t += 1
                del messages
            gc.collect()
            return handles

        # Pass 1: RSS only (tracemalloc's own bookkeeping would inflate RSS).
        gc.collect()
        rss0 = rss_bytes()
        handles = await fill("rss")
        rss1 = rss_bytes()
        for h in handles:
            await server.close_session(h.session_id)
        # Pass 2: tracemalloc, with the allocation sites that hold the most.
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        traced0 = tracemalloc.get_traced_memory()[0]
        handles = await fill("traced")
        traced1 = tracemalloc.get_traced_memory()[0]
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        top = [
            {"site": str(stat.traceback[0]), "bytes_per_session": round(stat.size_diff / args.sessions)}
            for stat in after.compare_to(before, "lineno")[: args.top]
        ]
        sessions = [server.session(h.session_id) for h in handles]
        shared = {id(tok), id(server), id(sessions[0].pool)}
        held = [holders(sn, shared) for sn in sessions]
        held_avg = {k: round(sum(h[k] for h in held) / len(held)) for k in held[0]}
        trajs = [sn.trajectory for sn in sessions]
        raw = sum(raw_array_bytes(tr) for tr in trajs) / len(trajs)
        npz = sum(len(tr.to_bytes()) for tr in trajs) / len(trajs)
        tokens = sum(sum(len(s) for s in tr.segments) for tr in trajs) / len(trajs)
        response = sum(sum(len(s.response_ids) for s in tr.segments) for tr in trajs) / len(trajs)
        segments = sorted({len(tr.segments) for tr in trajs})
        turns = sorted({tr.counters.turns for tr in trajs})
    finally:
        await server.stop()
    traced = (traced1 - traced0) / args.sessions
    rss = (rss1 - rss0) / args.sessions
    return {
        "sessions": args.sessions,
        "tokens_per_session": round(tokens),
        "response_tokens_per_session": round(response),
        "turns_per_session": turns,
        "segments_per_session": segments,
        "tracemalloc_bytes_per_session": round(traced),
        "rss_bytes_per_session": round(rss),
        "raw_arrays_bytes_per_session": round(raw),
        "npz_bytes_per_session": round(npz),
        "ratio_tracemalloc_to_raw": round(traced / raw, 2),
        "ratio_rss_to_raw": round(rss / raw, 2),
        "tracemalloc_bytes_per_token": round(traced / tokens, 1),
        "json_roundtrip": args.json_roundtrip,
        "holders_bytes_per_session": held_avg,
        "top_allocation_sites": top,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--reply-tokens", type=int, default=2000)
    ap.add_argument("--top", type=int, default=8, help="allocation sites to list")
    ap.add_argument(
        "--json-roundtrip",
        action="store_true",
        help="give each request freshly parsed messages, as the HTTP routes do",
    )
    args = ap.parse_args()
    proc, backend = spawn("--serve-backend", "--delay-ms", "0", "--reply-tokens", str(args.reply_tokens))
    try:
        load_before = os.getloadavg()
        started = time.time()
        result = asyncio.run(build(args, backend["url"]))
        out = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started)),
            "wall_s": round(time.time() - started, 1),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            **result,
        }
        print(json.dumps(out, indent=2))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
