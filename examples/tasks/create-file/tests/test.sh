#!/bin/bash
# Reward 1 when /app/hello.txt holds exactly "Hello, trialflow!\n", else 0.
if [ -f /app/hello.txt ] && [ "$(od -An -c /app/hello.txt | tr -s ' ')" = "$(printf 'Hello, trialflow!\n' | od -An -c | tr -s ' ')" ]; then
  echo 1 > /logs/verifier/reward.txt
  echo "PASS: content matches"
else
  echo 0 > /logs/verifier/reward.txt
  echo "FAIL: /app/hello.txt missing or content differs"
fi
