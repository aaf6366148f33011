#!/bin/bash
# Reward 1 when /app/items.json lists "harbor" AND the live API (still up while the verifier
# runs, as in Harbor) holds it too: the item was really created, not just written to a file.
python3 - <<'PY'
import json, pathlib, urllib.request
ok = False
try:
    written = json.loads(pathlib.Path("/app/items.json").read_text())
    with urllib.request.urlopen("http://api-server:5000/items", timeout=5) as r:
        live = json.loads(r.read())
    ok = "harbor" in [i["name"] for i in written] and "harbor" in [i["name"] for i in live]
    print("written:", written, "live:", live)
except Exception as e:
    print("check failed:", e)
pathlib.Path("/logs/verifier/reward.txt").write_text("1\n" if ok else "0\n")
PY
