"""infra.tiktoken_vocab: the npm package's compact ranks -> the .tiktoken file harmony checks."""

from __future__ import annotations

import hashlib

from infra.tiktoken_vocab import SHA256, ranks_from_npm_json


def test_compact_ranks_expand_to_one_line_per_token():
    data = {"bpe_ranks": "! 0 IQ== Ig==\n! 5 Iw==\n"}
    assert ranks_from_npm_json(data) == b"IQ== 0\nIg== 1\nIw== 5\n"


def test_written_vocab_has_the_hash_harmony_expects(harmony_vocab):
    from pathlib import Path

    data = (Path(harmony_vocab) / "o200k_base.tiktoken").read_bytes()
    assert hashlib.sha256(data).hexdigest() == SHA256
