#!/bin/bash
# north: 120*0.25 + 16*3.10 + 4*41.00 + 500*0.04 = 30 + 49.6 + 164 + 20 = 263.60; +8% = 284.688 -> 284.69
expected="284.69"
got="$(tr -d '[:space:]' < /app/report.txt 2>/dev/null)"
if [ "$got" = "$expected" ]; then
  echo 1 > /logs/verifier/reward.txt; echo "PASS"
else
  echo 0 > /logs/verifier/reward.txt; echo "FAIL: expected $expected, got '${got}'"
fi
