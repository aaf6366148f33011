"""The tiny test/demo model: our own byte-level BPE tokenizer, our own chat template, random Qwen3.

No weights can be downloaded here, so tests and demos build a model at run time.

Public API:

    build_tokenizer(out_dir: Path) -> PreTrainedTokenizerFast
        Trains (or reuses) the BPE tokenizer and saves it, with the chat template, in ``out_dir``.
    build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path
        Tokenizer + random-init ``Qwen3ForCausalLM`` (bf16) in ``out_dir``; returns ``out_dir``.
    token_id(tokenizer, token: str) -> int
        The id of one vocabulary token; TypeError when the token is not in the vocabulary.
    build_tiny_moe_config(vocab_size: int = 3072) -> Qwen3MoeConfig
        Config only (no weights): R3 cannot run on the CPU backend, so MoE is exercised through the
        scripted vLLM double, which needs the layer count and top_k. See TINY_MOE_LAYERS / TINY_MOE_TOP_K.
    CHAT_TEMPLATE, SPECIAL_TOKENS, EOS_TOKEN, PAD_TOKEN, BUILDER_VERSION

Both builders are idempotent: ``out_dir`` is reused when its marker file
(``trialflow-tinymodel.json``) names the same ``BUILDER_VERSION`` (and seed, for the model).
An incomplete directory (no marker, other version) is rebuilt. Building happens in a sibling
temporary directory renamed into place, so a crash never leaves a half-written model behind
a valid marker, and two concurrent builders both end with a complete directory.

Chat template (ChatML, written for this project):
- Every turn is ``<|im_start|>{role}\\n{text}<|im_end|>\\n``; ``<|im_end|>`` is the EOS token.
- ``system`` messages may appear at any position (Claude Code sends them mid-conversation).
- ``tools`` are rendered as JSON lines in the first system turn; if the conversation does not
  start with a system message, a system turn holding only the tools block comes first.
  With no messages at all nothing is rendered (so the empty render is a prefix of every render).
- assistant ``reasoning_content`` (non-empty) renders as ``<think>\\n{reasoning}\\n</think>\\n\\n``
  before the content; it is kept in every turn, never stripped from older turns, because
  dropping it would break prefix stability.
- assistant ``tool_calls`` render hermes-style, one per block, separated by newlines:
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; string arguments are
  inserted verbatim (assumed to be JSON text already).
- each ``tool`` message is its own user turn ``<tool_response>\\n...\\n</tool_response>`` (not
  grouped with neighbours: grouping would make the render depend on the next message).
- content may be a string, None, or a list of ``{"type": "text", "text": ...}`` parts.
- ``add_generation_prompt`` appends ``<|im_start|>assistant\\n``; with ``enable_thinking=False``
  it also appends an empty ``<think>\\n\\n</think>\\n\\n`` block.
- Prefix stability: for any k, render(messages[:k]) is a prefix of render(messages)
  (add_generation_prompt=False), because no message's text depends on the messages after it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig

BUILDER_VERSION = 1
# Digest of the code this process runs (not of the file on disk, which may have changed since
# import): cache directories keyed by it never receive a model built by older code.
SOURCE_DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
MARKER = "trialflow-tinymodel.json"

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
EOS_TOKEN = IM_END
PAD_TOKEN = "<|endoftext|>"
# Control tokens: skipped when decoding with skip_special_tokens=True.
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# Markup tokens: single ids, but NOT special, so decoded text keeps them for the parsers.
MARKUP_TOKENS = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
VOCAB_SIZE = 3072  # BPE target, including the tokens above
TINY_MOE_LAYERS = 2
TINY_MOE_TOP_K = 2

# Jinja macros the family fixtures (trialflow.families) share with this template.
# Content may be a string, None or a list of {"type": "text", "text": ...} parts (HF chat dicts).
TEXT_MACRO = r"""
{%- macro text(c) -%}
    {%- if c is none -%}
    {%- elif c is string -%}{{- c -}}
    {%- else -%}
        {%- for p in c -%}{%- if p.type == 'text' -%}{{- p.text -}}{%- endif -%}{%- endfor -%}
    {%- endif -%}
{%- endmacro -%}
""".strip()
# The hermes-style tools preamble (Qwen 2.5 / Qwen3 wording), a macro of the ``tools`` variable.
HERMES_TOOLS_MACRO = r"""
{%- macro tools_block() -%}
    {{- '# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for t in tools -%}{{- '\n' + (t | tojson) -}}{%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
{%- endmacro -%}
""".strip()

# Every tag trims the whitespace around it, so the layout below is free; all output text is
# in explicit string literals (Jinja turns '\n' in literals into newlines).
CHAT_TEMPLATE = (
    TEXT_MACRO
    + HERMES_TOOLS_MACRO
    + r"""
{%- if tools and messages and messages[0].role != 'system' -%}
    {{- '<|im_start|>system\n' + tools_block() + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {{- '<|im_start|>system\n' + text(m.content) -}}
        {%- if loop.first and tools -%}{{- '\n\n' + tools_block() -}}{%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'user' -%}
        {{- '<|im_start|>user\n' + text(m.content) + '<|im_end|>\n' -}}
    {%- elif m.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' -}}
        {%- if m.reasoning_content is defined and m.reasoning_content -%}
            {{- '<think>\n' + m.reasoning_content + '\n</think>\n\n' -}}
        {%- endif -%}
        {%- set body = text(m.content) -%}
        {{- body -}}
        {%- if m.tool_calls is defined and m.tool_calls -%}
            {%- for tc in m.tool_calls -%}
                {%- set f = tc.function if tc.function is defined else tc -%}
                {%- if body or not loop.first -%}{{- '\n' -}}{%- endif -%}
                {{- '<tool_call>\n{"name": ' + (f.name | tojson) + ', "arguments": ' -}}
                {%- if f.arguments is string -%}{{- f.arguments -}}
                {%- else -%}{{- f.arguments | tojson -}}{%- endif -%}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'tool' -%}
        {{- '<|im_start|>user\n<tool_response>\n' + text(m.content) + '\n</tool_response><|im_end|>\n' -}}
    {%- else -%}
        {{- raise_exception('unknown role: ' + m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}
        {{- '<think>\n\n</think>\n\n' -}}
    {%- endif -%}
{%- endif -%}
""".strip()
)


# --------------------------------------------------------------------------- corpus

_WORDS = (  # noqa: SIM905 (a word list reads better as one string)
    "the a an of to in and or for with on at by from is are was be this that it file run test "
    "build error fix code function value return list dict string number user agent model token "
    "task step output input path directory command shell python json config server request "
    "response message tool call result check read write create update delete print line first "
    "last next before after new old data time size count name type key item index should will "
    "can must not if then else when while because so we you they he she our your their please "
    "let me look see found missing failed passed works need want use using used make add remove"
).split()
_IDENTS = (  # noqa: SIM905
    "self args kwargs result value items path name data config request response tokens ids "
    "messages tool_calls content reasoning session segment prompt_ids logprobs mask out_dir "
    "parser parse_output trajectory turn count offset buf line text error exc i j k n x y"
).split()
_SHELL = (
    "ls -la",
    "cd /app && make test",
    "cat README.md",
    "grep -rn TODO src/",
    "python -m pytest -q",
    "git status",
    "git diff --stat",
    "pip install -e .",
    "echo $HOME",
    "mkdir -p build/out",
    "find . -name '*.py' | head",
    "sed -n 1,40p main.py",
    "tail -f /var/log/syslog",
    "curl -s http://localhost:8000/health",
    "rm -rf /tmp/cache",
    "chmod +x run.sh && ./run.sh",
    "export PATH=$PATH:/usr/local/bin",
    "wc -l *.txt",
    "npm install && npm run build",
    "docker ps -a",
    "cp config.yaml config.yaml.bak",
    "apt-get update && apt-get install -y curl",
)
_PY = (
    (
        'def {a}({b}, {c}=None):\n    """Return the {w} of {b}."""\n    if {c} is None:\n        {c} = []\n'
        "    for {d} in {b}:\n        {c}.append({d})\n    return {c}\n"
    ),
    (
        "class {A}:\n    def __init__(self, {b}: int = {n}) -> None:\n        self.{b} = {b}\n\n"
        '    def __repr__(self) -> str:\n        return f"{A}({{self.{b}!r}})"\n'
    ),
    'import os\nimport sys\nfrom pathlib import Path\n\n{a} = Path(os.environ.get("{B}", "/tmp"))\n',
    'try:\n    {a} = json.loads({b})\nexcept ValueError as exc:\n    raise RuntimeError(f"bad {w}: {{exc}}")\n',
    'with open({a}, "r", encoding="utf-8") as f:\n    for {d} in f:\n        print({d}.strip())\n',
    "assert {a} == {n}, {b}\nwhile {c} < {n}:\n    {c} += 1\n",
)


def _corpus(rng: random.Random) -> list[str]:
    """A deterministic mixed corpus: English, shell, Python, JSON tool calls, chat markup."""
    docs: list[str] = []
    for _ in range(3000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 18))]
        sentence = " ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ":"])
        docs.append(sentence)
    for _ in range(1500):
        docs.append("$ " + rng.choice(_SHELL) + "\n" + rng.choice(_SHELL))
    for _ in range(2000):
        template = rng.choice(_PY)
        a, b, c, d = (rng.choice(_IDENTS) for _ in range(4))
        docs.append(
            template.format(
                a=a,
                b=b,
                c=c,
                d=d,
                w=rng.choice(_WORDS),
                A=rng.choice(_IDENTS).title().replace("_", ""),
                B=rng.choice(_IDENTS).upper(),
                n=rng.randint(0, 4096),
            )
        )
    for _ in range(2000):
        args = {
            rng.choice(_IDENTS): rng.choice([rng.randint(0, 999), rng.choice(_SHELL), True, None])
            for _ in range(rng.randint(1, 3))
        }
        call = json.dumps({"name": rng.choice(["Bash", "Read", "Edit", "Write", "Grep"]), "arguments": args})
        docs.append(f"<tool_call>\n{call}\n</tool_call>")
        docs.append(f"<|im_start|>user\n<tool_response>\n{rng.choice(_SHELL)}\n</tool_response><|im_end|>\n")
        docs.append(
            f"<|im_start|>assistant\n<think>\n{rng.choice(_WORDS)} {rng.choice(_WORDS)}\n</think>\n\n"
        )
    return docs


# --------------------------------------------------------------------------- builders


def _read_marker(out_dir: Path) -> dict | None:
    """The directory's marker, or None when it is missing, unreadable or not a JSON object."""
    try:
        marker = json.loads((out_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def _publish(tmp: Path, out_dir: Path, complete: Callable[[dict | None], bool]) -> None:
    """Move a fully built ``tmp`` to ``out_dir``; a concurrent builder may have won the race."""
    if out_dir.exists() and not complete(_read_marker(out_dir)):
        shutil.rmtree(out_dir, ignore_errors=True)
    try:
        os.rename(tmp, out_dir)
    except OSError:
        if not complete(_read_marker(out_dir)):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def _train_tokenizer(dest: Path) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(random.Random(1234)), trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=65536,  # the demo serves 64K contexts (see infra.services)
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(dest)


def build_tokenizer(out_dir: Path) -> PreTrainedTokenizerFast:
    """Build (or reuse) the tokenizer in ``out_dir`` and return it loaded.

    If ``out_dir`` already holds a tokenizer (or a full model) from this builder version it is
    reused as is. The BPE corpus is fixed, so every build yields the same vocabulary.
    """
    from transformers import PreTrainedTokenizerFast

    out_dir = Path(out_dir)

    def ok(marker: dict | None) -> bool:
        return marker is not None and marker.get("version") == BUILDER_VERSION

    if not ok(_read_marker(out_dir)):
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
        _train_tokenizer(tmp)
        (tmp / MARKER).write_text(json.dumps({"version": BUILDER_VERSION, "parts": ["tokenizer"]}))
        _publish(tmp, out_dir, ok)
    return PreTrainedTokenizerFast.from_pretrained(out_dir)


def token_id(tokenizer: PreTrainedTokenizerFast, token: str) -> int:
    """The id of one token of ``tokenizer``'s vocabulary (``convert_tokens_to_ids`` of one string)."""
    ids = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(ids, int):
        raise TypeError(f"{token!r} did not convert to one token id: {ids!r}")
    return ids


def _model_config(
    tokenizer: PreTrainedTokenizerFast, *, pad_token: str, bos_token: str | None, eos_ids: list[int]
) -> Qwen3Config:
    """The tiny architecture for ``tokenizer``'s vocabulary; BOS falls back to the pad token."""
    from transformers import Qwen3Config

    vocab = -(-len(tokenizer) // 64) * 64
    pad_id = token_id(tokenizer, pad_token)
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # 16 fails on vLLM's CPU attention backend
        max_position_embeddings=32768,  # the demo serves Claude Code's ~15K-token prompts
        tie_word_embeddings=True,
        bos_token_id=token_id(tokenizer, bos_token) if bos_token else pad_id,
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
        pad_token_id=pad_id,
        dtype="bfloat16",
    )


def _random_model(config: Qwen3Config, seed: int) -> Qwen3ForCausalLM:
    """A random-init bf16 model whose weights depend only on ``config`` and ``seed``."""
    try:
        import torch
    except ModuleNotFoundError:  # torch is the `tiny` extra: only these weights need it
        raise ModuleNotFoundError(
            "the tiny model's weights need torch: pip install 'trialflow[tiny]' (infra/setup.sh does)"
        ) from None
    from transformers import Qwen3ForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    # Module.bfloat16() casts the floating-point parameters and buffers as .to(torch.bfloat16)
    # does (transformers' @wraps(Module.to) override hides the bound self from type checkers).
    return model.bfloat16()


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Build (or reuse) tokenizer + random-init bf16 ``Qwen3ForCausalLM`` in ``out_dir``.

    Reused when the marker names this builder version, the same seed and the model part;
    otherwise the directory is rebuilt from scratch. Weights depend only on ``seed``.
    """
    from transformers import GenerationConfig

    out_dir = Path(out_dir)

    def ok(marker: dict | None) -> bool:
        return (
            marker is not None
            and marker.get("version") == BUILDER_VERSION
            and marker.get("seed") == seed
            and "model" in marker.get("parts", ())
        )

    if ok(_read_marker(out_dir)):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    tokenizer = build_tokenizer(tmp / "tok")
    config = _model_config(
        tokenizer, pad_token=PAD_TOKEN, bos_token=None, eos_ids=[token_id(tokenizer, EOS_TOKEN)]
    )
    model = _random_model(config, seed)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(tmp / "tok")
    (tmp / MARKER).write_text(
        json.dumps({"version": BUILDER_VERSION, "seed": seed, "parts": ["tokenizer", "model"]})
    )
    _publish(tmp, out_dir, ok)
    return out_dir


def build_tiny_moe_config(vocab_size: int = VOCAB_SIZE) -> Qwen3MoeConfig:
    """A tiny Qwen3-MoE config (no weights) for the scripted backend's routed-experts shapes."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=TINY_MOE_LAYERS,
        num_attention_heads=2,  # head_dim = hidden_size / num_attention_heads = 64
        num_key_value_heads=1,
        num_experts=8,
        num_experts_per_tok=TINY_MOE_TOP_K,
        max_position_embeddings=4096,
    )
