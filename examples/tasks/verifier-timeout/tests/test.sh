#!/bin/bash
# Deliberately slower than [verifier].timeout_sec (3 s): the reward written at the end must
# never be read.
echo "checking slowly..."
sleep 30
if grep -qx done /app/done.txt 2>/dev/null; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
