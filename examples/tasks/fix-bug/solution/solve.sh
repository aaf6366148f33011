#!/bin/bash
set -euo pipefail
cd /app
python3 - <<'PY'
src = open("stats.py").read()
fixed = src.replace(
    "    n = len(values)\n    return values[n // 2]\n",
    "    ordered = sorted(values)\n"
    "    n = len(ordered)\n"
    "    mid = n // 2\n"
    "    if n % 2:\n"
    "        return ordered[mid]\n"
    "    return (ordered[mid - 1] + ordered[mid]) / 2\n",
)
assert fixed != src, "expected buggy median() not found"
open("stats.py", "w").write(fixed)
PY
python3 -m unittest -q test_stats
