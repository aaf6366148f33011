"""Scores /app/primes.py on three axes and writes /logs/verifier/reward.json.

style and efficiency only count for a fully correct solution (an empty stub must not
earn style points)."""

import ast
import json
import os
import sys
import time

REWARD = "/logs/verifier/reward.json"
CASES = {
    0: [],
    1: [],
    2: [],
    3: [2],
    10: [2, 3, 5, 7],
    30: [2, 3, 5, 7, 11, 13, 17, 19, 23, 29],
    100: [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97],
}
LIMIT = int(os.environ.get("SCORE_LIMIT", "1000000"))
scores = {"correctness": 0.0, "style": 0.0, "efficiency": 0.0}


def write():
    with open(REWARD, "w") as fh:
        json.dump(scores, fh)
    print(json.dumps(scores))


sys.path.insert(0, "/app")
try:
    from primes import primes_below
except Exception as exc:  # a broken module scores zero everywhere
    print(f"import failed: {exc!r}")
    write()
    sys.exit(0)

passed = 0
for n, want in CASES.items():
    try:
        passed += list(primes_below(n)) == want
    except Exception as exc:
        print(f"primes_below({n}) raised {exc!r}")
scores["correctness"] = round(passed / len(CASES), 4)

if scores["correctness"] == 1.0:
    source = open("/app/primes.py").read()
    tree = ast.parse(source)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "primes_below")
    has_doc = ast.get_docstring(fn) is not None
    short_lines = all(len(line) <= 100 for line in source.splitlines())
    scores["style"] = (0.5 if has_doc else 0.0) + (0.5 if short_lines else 0.0)
    t0 = time.monotonic()
    big = primes_below(LIMIT)
    elapsed = time.monotonic() - t0
    print(f"primes_below({LIMIT}) took {elapsed:.2f}s, {len(big)} primes")
    scores["efficiency"] = 1.0 if elapsed <= 3.0 and len(big) == 78498 else 0.0
write()
