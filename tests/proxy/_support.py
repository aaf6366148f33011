"""Shared helpers for the proxy I/O tests (tokenizer of the tiny model, scripted doubles)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer


def load_tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(str(model_dir))
