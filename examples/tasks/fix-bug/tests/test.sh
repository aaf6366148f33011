#!/bin/bash
# Reward 1 when the task's own tests and the hidden tests pass, else 0.
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if python3 -m unittest -q test_stats && python3 /tests/test_hidden.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
