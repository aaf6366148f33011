"""CPU to validate and convert a request's history: each adapter without and with the
session's ``MessageMemo`` (``proxy.wire``), on the second sight of the same history.

Histories of N messages after a ~700-word system prompt, two kinds:
- ``text``: user / assistant turns with string content (a chat);
- ``tools``: assistant tool calls and tool results (a coding agent: OpenAI ``tool_calls`` +
  ``tool`` messages, Anthropic ``tool_use`` + ``tool_result`` blocks).
Timed per parse (``time.perf_counter``, median of ``--samples``), back to back ("warm") and
after 20 ms of spin-waiting ("after gap", how a proxy serving few sessions runs; see
``proxy_overhead.py``'s ``cache_eviction``). The body is decoded (orjson) outside the timing.

    .venv/bin/python bench/request_parse.py [--messages 16 80 200] [--samples 40]
"""

from __future__ import annotations

import argparse
import json
import time

import orjson

from proxy import anthropic_api, openai_api
from proxy.wire import MessageMemo

WORDS = "the function reads the file and returns a list of".split()


def words(n: int, salt: int) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n))


def bodies(n: int, kind: str) -> tuple[bytes, bytes]:
    """(OpenAI body, Anthropic body) with ``n`` history messages of ``kind``."""
    system = words(700, 1)
    oa: list[dict] = [{"role": "user", "content": "fix the failing tests"}]
    an: list[dict] = [{"role": "user", "content": "fix the failing tests"}]
    for i in range(n // 2):
        if kind == "text":
            oa += [{"role": "assistant", "content": words(150, i)}, {"role": "user", "content": words(45, i)}]
        else:
            args = {"command": f"sed -n {i},{i + 40}p src/module_{i}.py"}
            oa += [
                {
                    "role": "assistant",
                    "content": words(30, i),
                    "tool_calls": [
                        {
                            "id": f"call_{i}",
                            "type": "function",
                            "function": {"name": "bash", "arguments": json.dumps(args)},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": f"call_{i}", "content": words(120, i)},
            ]
        last = oa[-2:]
        if kind == "text":
            an += last
        else:
            an += [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": last[0]["content"]},
                        {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": args},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": last[1]["content"]}
                    ],
                },
            ]
    return (
        orjson.dumps({"model": "m", "messages": [{"role": "system", "content": system}, *oa]}),
        orjson.dumps({"model": "m", "max_tokens": 512, "system": system, "messages": an, "stream": True}),
    )


def median_ms(parse, raw: bytes, samples: int, gap: bool) -> float:
    times = []
    for _ in range(samples):
        if gap:
            end = time.perf_counter() + 0.02
            while time.perf_counter() < end:
                pass
        body = orjson.loads(raw)
        t0 = time.perf_counter()
        parse(body)
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[samples // 2] * 1e3, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, nargs="+", default=[16, 80, 200])
    ap.add_argument("--samples", type=int, default=40)
    args = ap.parse_args()
    rows = []
    for kind in ("text", "tools"):
        for n in args.messages:
            oa_raw, an_raw = bodies(n, kind)
            for protocol, parse, raw in (
                ("openai", openai_api.parse_chat_request, oa_raw),
                ("anthropic", anthropic_api.parse_messages_request, an_raw),
            ):
                memo = MessageMemo()
                parse(orjson.loads(raw), memo)  # the first sight fills the memo
                row = {"kind": kind, "messages": n, "protocol": protocol, "body_bytes": len(raw)}
                for gap in (False, True):
                    where = "after_gap" if gap else "warm"
                    plain = median_ms(parse, raw, args.samples, gap)
                    memoized = median_ms(lambda b, m=memo, p=parse: p(b, m), raw, args.samples, gap)
                    row[where] = {
                        "no_memo_ms": plain,
                        "memo_ms": memoized,
                        "ratio": round(memoized / plain, 2),
                    }
                rows.append(row)
                print(json.dumps(row), flush=True, file=__import__("sys").stderr)
    print(json.dumps({"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
