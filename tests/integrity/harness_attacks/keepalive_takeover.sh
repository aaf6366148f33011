#!/bin/bash
# Attack 1: take over the keep-alive (ptrace, then /proc/PID/mem), which stop_processes spared.
python3 /solution/inject.py > /app/inject.json 2>&1
exit 0
