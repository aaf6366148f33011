#!/bin/bash
# Deliberately broken verifier: crashes with a traceback before writing any reward file.
set -e
echo "starting checks"
python3 -c 'import json; json.load(open("/tests/missing-config.json"))'
echo 1 > /logs/verifier/reward.txt
