"""trialflow.settings: the harmony vocabulary setting, and that the proxy's entry points hand it
to harmony themselves (no caller exports TIKTOKEN_ENCODINGS_BASE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trialflow.settings import DEFAULT_HARMONY_VOCAB_DIR, load_settings

REPO = Path(__file__).resolve().parents[2]


def test_harmony_vocab_dir_sources_strongest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    monkeypatch.delenv("TRIALFLOW_HARMONY_VOCAB_DIR", raising=False)
    assert load_settings().harmony_vocab_dir == DEFAULT_HARMONY_VOCAB_DIR
    assert DEFAULT_HARMONY_VOCAB_DIR == REPO / ".cache" / "tiktoken"  # where infra/setup.sh writes it
    monkeypatch.setenv("TIKTOKEN_ENCODINGS_BASE", "/from/harmony/variable")
    assert load_settings().harmony_vocab_dir == Path("/from/harmony/variable")
    monkeypatch.setenv("TRIALFLOW_HARMONY_VOCAB_DIR", "/from/trialflow/variable")
    assert load_settings().harmony_vocab_dir == Path("/from/trialflow/variable")
    assert load_settings(harmony_vocab_dir="/flag").harmony_vocab_dir == Path("/flag")


def _open_proxy_in_clean_process(model_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`trialflow.cli._worker.open_proxy` in a fresh interpreter whose environment names no vocabulary
    (harmony reads its variable once per process, so this cannot run in the test's own)."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TIKTOKEN_ENCODINGS_BASE", "TRIALFLOW_HARMONY_VOCAB_DIR")
    }
    code = (
        "import sys; from trialflow.settings import load_settings; from trialflow.cli._worker import open_proxy; "
        "proxy = open_proxy(load_settings(model_dir=sys.argv[1])); print(proxy.profile.tool_parser)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(model_dir)],
        cwd=REPO,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_worker_proxy_finds_the_harmony_vocabulary_without_the_variable(
    harmony_vocab: str, tmp_path: Path
) -> None:
    from trialflow.families import build_tokenizer_dir

    model_dir = build_tokenizer_dir("gpt_oss", tmp_path / "gpt_oss")
    # the setting's default location (the vocabulary infra/setup.sh wrote), nothing exported
    if not (DEFAULT_HARMONY_VOCAB_DIR / "o200k_base.tiktoken").is_file():
        pytest.skip("no vocabulary at the default location (run python -m infra.tiktoken_vocab)")
    ok = _open_proxy_in_clean_process(model_dir)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.strip() == "harmony"
    # the setting is what is read: an empty directory fails at start-up, naming the variable
    bad = _open_proxy_in_clean_process(model_dir, TRIALFLOW_HARMONY_VOCAB_DIR=str(tmp_path / "empty"))
    assert bad.returncode != 0
    assert "HarmonyUnavailable" in bad.stderr and "TIKTOKEN_ENCODINGS_BASE" in bad.stderr
