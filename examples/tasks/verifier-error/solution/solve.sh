#!/bin/bash
set -euo pipefail
echo done > /app/done.txt
