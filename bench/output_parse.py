"""CPU per turn to turn a generation's token ids into reasoning, content and tool calls.

Baseline (measured in the same run): the session's former path, one Rust decode with
``skip_special_tokens=True`` and ``parse_output`` on that string. Now: ``OutputDecoder`` (token
ids -> text and markup pieces) plus ``parse_output`` on the pieces, plus the prompt-tail decode
the reasoning parser reads. Per family fixture (trialflow.families), on that family's native
output (`FamilyFixture.native`, trialflow.families) with reasoning, a paragraph of text and two tool calls,
repeated to about ``--tokens`` ids. Prints one JSON document. Median of ``--samples`` runs
(``time.perf_counter``).
The baseline's result is wrong for GLM and gpt-oss (their markup is special, so it is gone
before parsing); it is the cost floor, not a correct alternative.

    PYTHONPATH=. .venv/bin/python bench/output_parse.py [--tokens 200 2000] [--samples 200]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from proxy.chat import ParsedOutput, ToolCall
from proxy.parsers import OutputDecoder, markup_of, parse_output, starts_inside_reasoning
from proxy.profiles import detect_profile
from trialflow.families import FAMILIES, family, make_tokenizer
from trialflow.families._build import generation_eos_ids

PARAGRAPH = "The function reads the file and returns a list of lines; the test expects a tuple. "


def _output(name: str, tok, n_tokens: int) -> list[int]:
    one_call = not family(name).traits.parallel_calls  # and no text beside it
    text_len = 1
    while True:
        calls = [
            ToolCall("a", "Bash", {"command": "echo '" + PARAGRAPH * (text_len if one_call else 1) + "'"})
        ]
        if not one_call:
            calls.append(ToolCall("b", "Read", {"path": "src/io.py"}))
        p = ParsedOutput(content=PARAGRAPH * text_len, reasoning=PARAGRAPH * text_len, tool_calls=calls)
        if one_call:
            p.content = ""
        text, stop = family(name).native(p)
        ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids(stop)]
        if len(ids) >= n_tokens or text_len > 10_000:
            return ids
        text_len *= 2


def _median(fn, samples: int) -> float:
    times = []
    for _ in range(samples):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[200, 2000])
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args()
    rows = []
    for name in sorted(FAMILIES):
        tok = make_tokenizer(name)
        profile = detect_profile(tok, generation_eos=generation_eos_ids(family(name), tok))
        reasoning, tools = profile.reasoning_parser, profile.tool_parser
        decoder = OutputDecoder(tok, markup_of(reasoning, tools))
        backend = tok.backend_tokenizer
        prompt_tail = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)[-16:]
        for n in args.tokens:
            ids = _output(name, tok, n)

            def before(ids=ids, backend=backend, r=reasoning, t=tools):
                return parse_output(backend.decode(ids, skip_special_tokens=True), reasoning=r, tools=t)

            def now(ids=ids, decoder=decoder, tail=prompt_tail, r=reasoning, t=tools):
                inside = starts_inside_reasoning(decoder.decode(tail), r)
                return parse_output(
                    decoder.decode(ids), reasoning=r, tools=t, started_inside_reasoning=inside
                )

            base, cur = _median(before, args.samples), _median(now, args.samples)
            calls = len(now().tool_calls)
            rows.append(
                {
                    "family": name,
                    "tokens": len(ids),
                    "baseline_us": round(base * 1e6, 1),
                    "now_us": round(cur * 1e6, 1),
                    "ratio": round(cur / base, 2),
                    "calls": calls,
                }
            )
            print(name, len(ids), file=sys.stderr)
    print(json.dumps({"samples": args.samples, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
