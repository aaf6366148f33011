"""Fixtures shared by the proxy tests."""

from __future__ import annotations

import pytest

from tests.proxy._support import load_tokenizer


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    """The tiny model's tokenizer (its own BPE and chat template; see trialflow.tinymodel)."""
    return load_tokenizer(tiny_model_dir)
