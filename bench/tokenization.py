"""Proxy CPU per turn for incremental tokenization: turn 1 vs turn 100 of a ~64K-token session.

Drives ``ConversationTracker`` (the pure core the proxy runs per turn: prepare + commit) the way
an agent session grows: each turn the "model" answers ~600 tokens with a tool call and the
client sends back a tool result of ~40 tokens. CPU time is ``time.process_time`` per turn,
median over repeated measurements of the same turn on copies of the tracker state.

``--family`` picks the tokenizer and chat template: ``tiny`` (the project's own, default) or a
family fixture of trialflow.families (``all`` runs each); the "model" then answers in that
family's native output format (`FamilyFixture.native`, trialflow.families), with its stop token.

    .venv/bin/python bench/tokenization.py [--turns 100] [--target-tokens 65536] [--family tiny|NAME|all]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
from pathlib import Path

from proxy.chat import ChatRequest, Generation, ParsedOutput, ToolCall
from proxy.profiles import detect_profile
from proxy.tokenization import ConversationTracker
from trialflow.families import FAMILIES, family, make_tokenizer
from trialflow.families._build import generation_eos_ids
from trialflow.tinymodel import build_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def _native(name: str, parsed: ParsedOutput) -> tuple[str, str]:
    # The tiny model's template is Qwen3's chatml with think blocks: it writes what Qwen3 writes.
    return family("qwen3" if name == "tiny" else name).native(parsed)


def assistant_turn(tok, name: str, i: int, words: int) -> tuple[ParsedOutput, list[int]]:
    text = " ".join(f"step{i} looks at file{j}.py and edits line {j}" for j in range(words))
    call = ToolCall(id=f"call_{i}", name="Bash", arguments={"command": f"cat file{i}.py"})
    parsed = ParsedOutput(content=text, tool_calls=[call])
    body, stop = _native(name, parsed)
    if text not in body:  # Llama-3.1 and gpt-oss emit no text with a call: the bulk goes into it
        call = ToolCall(id=f"call_{i}", name="Bash", arguments={"command": f"cat file{i}.py  # {text}"})
        parsed = ParsedOutput(content="", tool_calls=[call])
        body, stop = _native(name, parsed)
    return parsed, tok.encode(body, add_special_tokens=False) + [tok.convert_tokens_to_ids(stop)]


def _tokenizer(name: str):
    if name == "tiny":
        tok = build_tokenizer(Path(tempfile.gettempdir()) / "trialflow-bench-tokenizer")
        return tok, detect_profile(tok)
    tok = make_tokenizer(name)
    return tok, detect_profile(tok, generation_eos=generation_eos_ids(family(name), tok))


def run(turns: int, target_tokens: int, repeats: int, name: str = "tiny") -> dict:
    tok, profile = _tokenizer(name)
    tracker = ConversationTracker(tok, session_id="bench", profile=profile)
    messages = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing tests in this repository."},
    ]
    # words per assistant turn so that `turns` turns reach about target_tokens
    per_turn = target_tokens // turns
    probe_parsed, probe_ids = assistant_turn(tok, name, 0, 10)
    words = max(1, int(10 * per_turn / max(1, len(probe_ids))))
    cpu_per_turn: dict[int, float] = {}
    for i in range(1, turns + 1):
        # a fresh copy per request, as a client re-sending its history over HTTP would produce
        request = ChatRequest(protocol="openai", messages=json.loads(json.dumps(messages)), tools=TOOLS)
        parsed, gen_ids = assistant_turn(tok, name, i, words)

        def one_turn(
            tr: ConversationTracker, request: ChatRequest = request, gen_ids=gen_ids, parsed=parsed
        ) -> None:
            prepared = tr.prepare(request)
            gen = Generation(
                prompt_token_ids=prepared.prompt_ids,
                token_ids=gen_ids,
                logprobs=[-0.5] * len(gen_ids),
                finish_reason="tool_calls",
            )
            tr.commit(prepared, gen, parsed)

        if i in (1, turns):
            samples = []
            for _ in range(repeats):
                trial = copy.deepcopy(tracker)
                t0 = time.process_time()
                one_turn(trial)
                samples.append(time.process_time() - t0)
            cpu_per_turn[i] = statistics.median(samples)
        one_turn(tracker)
        messages.append(
            {
                "role": "assistant",
                "content": parsed.content,
                "tool_calls": [
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)},
                    }
                    for tc in parsed.tool_calls
                ],
            }
        )
        messages.append(
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"# file{i}.py\nprint('ok {i}')\n"}
        )
    main = tracker.trajectory.segments[0]
    assert len(tracker.trajectory.segments) == 1, "every turn must extend the main segment"
    return {
        "family": name,
        "turns": turns,
        "session_tokens": len(main.full_ids),
        "cpu_ms_turn_1": cpu_per_turn[1] * 1e3,
        f"cpu_ms_turn_{turns}": cpu_per_turn[turns] * 1e3,
        "ratio": cpu_per_turn[turns] / cpu_per_turn[1],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--target-tokens", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--family", default="tiny", help="tiny, a trialflow.families name, or all")
    args = ap.parse_args()
    names = ["tiny", *FAMILIES] if args.family == "all" else [args.family]
    for name in names:
        print(json.dumps(run(args.turns, args.target_tokens, args.repeats, name)))


if __name__ == "__main__":
    main()
