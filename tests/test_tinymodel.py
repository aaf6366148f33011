"""trialflow.tinymodel: tokenizer, chat template (prefix stability, agreement with the parsers), model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from proxy.chat import ParsedOutput, ToolCall, assistant_message
from proxy.parsers import parse_output
from tests._hypothesis import examples
from trialflow import tinymodel

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def render(tok, messages, *, tools=None, gen=False, **kw) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen, **kw)


# ------------------------------------------------------------------ tokenizer


def test_special_and_markup_tokens_are_single_ids(tok):
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for t in tinymodel.SPECIAL_TOKENS + tinymodel.MARKUP_TOKENS:
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1, t
    assert 2000 <= len(tok) <= 4096


def test_decode_keeps_markup_but_drops_control_tokens(tok):
    text = "<think>\nx\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    ids = tok.encode(text + "<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids) == text + "<|im_end|>"


def test_encode_decode_roundtrip_on_code(tok):
    text = 'def f(x):\n    return {"a": [1, 2]}  # ünïcode ✓\n$ ls -la | grep .py\n'
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


# ------------------------------------------------------------------ chat template


def test_template_layout(tok):
    msgs = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "list "}, {"type": "text", "text": "files"}]},
        {
            "role": "assistant",
            "content": "Sure.",
            "reasoning_content": "need ls",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "system", "content": "mid-conversation reminder"},
        {"role": "user", "content": "thanks"},
    ]
    s = render(tok, msgs, tools=TOOLS, gen=True)
    head = "<|im_start|>system\nYou are terse.\n\n# Tools\n"
    assert s.startswith(head)
    assert json.dumps(TOOLS[0]) in s
    assert "<|im_start|>user\nlist files<|im_end|>\n" in s
    assert (
        "<|im_start|>assistant\n<think>\nneed ls\n</think>\n\nSure.\n<tool_call>\n"
        '{"name": "Bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
    ) in s
    assert "<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n" in s
    assert "<|im_start|>system\nmid-conversation reminder<|im_end|>\n" in s
    assert s.endswith("<|im_start|>user\nthanks<|im_end|>\n<|im_start|>assistant\n")


def test_tools_without_system_message_get_their_own_system_turn(tok):
    s = render(tok, [{"role": "user", "content": "hi"}], tools=TOOLS)
    assert s.startswith("<|im_start|>system\n# Tools\n") and "<|im_start|>user\nhi<|im_end|>\n" in s


def test_generation_prompt_and_thinking_switch(tok):
    msgs = [{"role": "user", "content": "hi"}]
    base = render(tok, msgs)
    assert render(tok, msgs, gen=True) == base + "<|im_start|>assistant\n"
    assert render(tok, msgs, gen=True, enable_thinking=True) == base + "<|im_start|>assistant\n"
    assert (
        render(tok, msgs, gen=True, enable_thinking=False)
        == base + "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_string_arguments_are_inserted_verbatim(tok):
    msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "Bash", "arguments": '{"command":"ls"}'}}
        ],
    }
    assert render(tok, [msg]) == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "Bash", "arguments": '
        '{"command":"ls"}}\n</tool_call><|im_end|>\n'
    )


def test_unknown_role_raises(tok):
    with pytest.raises(Exception, match="unknown role"):
        render(tok, [{"role": "narrator", "content": "x"}])


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_args = st.dictionaries(
    st.text("abcdefgh_", min_size=1, max_size=6),
    st.one_of(st.integers(-5, 5), _text, st.booleans(), st.none()),
    max_size=3,
)
_call = st.builds(
    lambda n, a: {"id": "id", "type": "function", "function": {"name": n, "arguments": a}},
    st.sampled_from(["Bash", "Read", "Edit"]),
    _args,
)
_message = st.one_of(
    st.builds(lambda t: {"role": "system", "content": t}, _text),
    st.builds(lambda t: {"role": "user", "content": t}, _text),
    st.builds(lambda t: {"role": "tool", "tool_call_id": "id", "content": t}, _text),
    st.builds(
        lambda c, r, calls: {
            "role": "assistant",
            "content": c,
            **({"reasoning_content": r} if r else {}),
            **({"tool_calls": calls} if calls else {}),
        },
        _text,
        st.one_of(st.none(), _text),
        st.lists(_call, max_size=2),
    ),
)


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(messages=st.lists(_message, min_size=1, max_size=8), with_tools=st.booleans())
def test_template_is_prefix_stable(tok, messages, with_tools):
    tools = TOOLS if with_tools else None
    full = render(tok, messages, tools=tools)
    for k in range(1, len(messages) + 1):  # HF cannot render an empty conversation
        assert full.startswith(render(tok, messages[:k], tools=tools))
    assert render(tok, messages, tools=tools, gen=True).startswith(full)
    assert full.count("<|im_start|>assistant\n") == full.count("<|im_end|>\n") - (
        full.count("<|im_start|>system\n") + full.count("<|im_start|>user\n")
    )


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    content=st.text("abc xyz\n.{}", max_size=30),
    reasoning=st.one_of(st.none(), st.text("abc \n", max_size=20)),
    calls=st.lists(st.tuples(st.sampled_from(["Bash", "Read"]), _args), max_size=3),
)
def test_template_and_parsers_agree(tok, content, reasoning, calls):
    """What the template renders for an assistant turn parses back to the same message."""
    parsed = ParsedOutput(
        content=content.strip(),
        reasoning=(reasoning or "").strip() or None,
        tool_calls=[ToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(calls)],
    )
    s = render(tok, [assistant_message(parsed)])
    body = s.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    ids = iter(f"c{i}" for i in range(len(calls)))
    back = parse_output(body, tool_call_id_factory=lambda: next(ids))
    if "<tool_call>" in parsed.content or "</think>" in parsed.content:
        return  # content that itself contains markup is ambiguous by design
    assert back == parsed


# ------------------------------------------------------------------ model + builder


def test_model_config_and_forward(tiny_model_dir: Path, tok):
    import torch
    from transformers import AutoConfig, Qwen3ForCausalLM

    cfg = AutoConfig.from_pretrained(tiny_model_dir)
    assert (
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.max_position_embeddings,
    ) == (128, 2, 2, 1, 64, 32768)
    assert cfg.vocab_size % 64 == 0 and cfg.vocab_size >= len(tok)
    assert cfg.eos_token_id == tok.eos_token_id and cfg.pad_token_id == tok.pad_token_id
    model = Qwen3ForCausalLM.from_pretrained(tiny_model_dir)
    assert model.dtype == torch.bfloat16
    ids = torch.tensor([tok.encode("hello world", add_special_tokens=False)])
    assert model(ids).logits.shape == (1, ids.shape[1], cfg.vocab_size)


def test_build_is_idempotent(tiny_model_dir: Path):
    before = {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()}
    assert tinymodel.build_tiny_model(tiny_model_dir) == tiny_model_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_model_dir.iterdir()} == before


def test_incomplete_directory_is_rebuilt_and_vocab_is_deterministic(tmp_path: Path, tok):
    out = tmp_path / "tok"
    out.mkdir()
    (out / "tokenizer.json").write_text("half written")  # no marker: not complete
    fresh = tinymodel.build_tokenizer(out)
    assert fresh.get_vocab() == tok.get_vocab()
    assert json.loads((out / tinymodel.MARKER).read_text())["version"] == tinymodel.BUILDER_VERSION
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no temporary directory left behind


def test_tiny_moe_config():
    cfg = tinymodel.build_tiny_moe_config()
    assert cfg.num_hidden_layers == tinymodel.TINY_MOE_LAYERS
    assert cfg.num_experts_per_tok == tinymodel.TINY_MOE_TOP_K and cfg.num_experts == 8


def test_a_marker_that_is_not_a_json_object_means_rebuild(tmp_path: Path, tok):
    out = tmp_path / "tok"
    out.mkdir()
    (out / tinymodel.MARKER).write_text('"version"')  # valid JSON, but not the builder's object
    assert tinymodel.build_tokenizer(out).get_vocab() == tok.get_vocab()
    assert json.loads((out / tinymodel.MARKER).read_text())["version"] == tinymodel.BUILDER_VERSION
