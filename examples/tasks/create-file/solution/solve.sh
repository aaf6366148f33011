#!/bin/bash
set -euo pipefail
printf 'Hello, trialflow!\n' > /app/hello.txt
