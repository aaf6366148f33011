"""Model profiles detected by probing each family fixture's template (proxy.profiles)."""

from __future__ import annotations

import pytest

from proxy.profiles import ModelProfile, UnsupportedTemplate, detect_profile, load_generation_eos
from trialflow.families import FAMILIES, build_tokenizer_dir, family, make_tokenizer
from trialflow.families._build import generation_eos_ids


def _profile(name: str) -> ModelProfile:
    tok = make_tokenizer(name)
    return detect_profile(tok, generation_eos=generation_eos_ids(family(name), tok))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_is_detected_from_its_template(name):
    p = _profile(name)
    expected = family(name).traits.profile
    assert tuple(getattr(p, f) for f in expected._fields) == expected
    assert p.stop_tokens[0] == family(name).eos_token
    assert set(family(name).generation_eos) <= set(p.stop_tokens) <= set(p.closers)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_familys_traits_agree_with_what_its_template_allows(name):
    """The fixture's statement of what the model does (read by every family test) and what its
    template expects: a family that reasons has a reasoning parser, one that makes parallel
    calls has a template that renders them."""
    t = family(name).traits
    assert t.parallel_calls == t.profile.parallel_tool_calls
    assert t.reasoning == (t.profile.reasoning_parser is not None)
    assert t.thinks_by_default <= t.reasoning


def test_a_preamble_and_reasoning_before_a_call_render_as_one_analysis_text():
    """gpt-oss's template refuses both texts on a call (its rule, reproduced by the fixture); the
    adapted message renders, as one analysis message (reasoning, then the preamble), before the call."""
    tok = make_tokenizer("gpt_oss")
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    msg = {"role": "assistant", "content": "I will look.", "reasoning_content": "think", "tool_calls": [call]}
    msgs = [{"role": "user", "content": "go"}, msg, {"role": "tool", "tool_call_id": "c", "content": "x"}]
    raw = [msgs[0], {**msg, "thinking": msg["reasoning_content"]}, msgs[2]]
    del raw[1]["reasoning_content"]
    with pytest.raises(Exception, match="Cannot pass both content and thinking"):
        tok.apply_chat_template(raw, tokenize=False)
    p = _profile("gpt_oss")
    adapted = p.adapt(msgs)
    assert adapted[1] == {
        "role": "assistant",
        "content": "",
        "thinking": "think\nI will look.",
        "tool_calls": [call],
    }
    text = tok.apply_chat_template(adapted, tokenize=False, add_generation_prompt=True)
    assert "<|channel|>analysis<|message|>think\nI will look.<|end|><|start|>assistant to=functions.f" in text
    # one text alone, a call without texts, and a message without a call are passed through
    for m in (
        {**msg, "content": ""},
        {**msg, "reasoning_content": ""},
        {"role": "assistant", "content": "a", "reasoning_content": "r"},
    ):
        assert p.adapt([m])[0].get("content") == m["content"]
    assert _profile("qwen3").adapt([msg]) == [msg]  # a template that takes both: unchanged


def test_gpt_oss_history_closer_is_end_although_the_model_stops_on_return():
    p = _profile("gpt_oss")
    assert "<|end|>" in p.closers and "<|end|>" not in p.stop_tokens


def test_generation_eos_is_read_from_the_model_dir(tmp_path):
    out = build_tokenizer_dir("llama31", tmp_path / "l")
    tok = make_tokenizer("llama31")
    assert load_generation_eos(out) == generation_eos_ids(family("llama31"), tok)
    assert load_generation_eos(tmp_path) is None
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": "x"}')
    with pytest.raises(UnsupportedTemplate, match="eos_token_id"):
        load_generation_eos(tmp_path)


def test_overrides_replace_fields_and_reject_unknown_ones():
    p = _profile("qwen3")
    q = p.with_overrides({"tool_parser": None, "stop_tokens": ["<|im_end|>"], "arguments": "string"})
    assert (q.tool_parser, q.stop_tokens, q.arguments) == (None, ("<|im_end|>",), "string")
    assert "<|im_end|>" in q.closers
    with pytest.raises(ValueError, match="unknown profile fields"):
        p.with_overrides({"nope": 1})
    with pytest.raises(TypeError):
        p.with_overrides({"stop_opens_next": "yes"})
    with pytest.raises(ValueError):
        p.with_overrides({"thinking_switch": "think_harder"})


def test_thinking_switch_and_adapt():
    gpt, ds = _profile("gpt_oss"), _profile("deepseek_v31")
    assert gpt.thinking_kwargs(False) == {"reasoning_effort": "low"} and gpt.thinking_kwargs(True) == {}
    assert ds.thinking_kwargs(True) == {"thinking": True} and ds.thinking_kwargs(None) == {}
    msg = {
        "role": "assistant",
        "content": "",
        "reasoning_content": "r",
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}],
    }
    (g,) = gpt.adapt([msg])
    assert g["thinking"] == "r" and "reasoning_content" not in g
    (d,) = ds.adapt([msg])
    assert d["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    assert msg["tool_calls"][0]["function"]["arguments"] == {"a": 1}  # the input is not changed


class _Tok:
    """A tokenizer double exposing only what detection reads, with a chosen template."""

    def __init__(self, base, template):
        self._base, self.chat_template = base, template

    def __getattr__(self, name):
        return getattr(self._base, name)

    def apply_chat_template(self, messages, **kw):
        return self._base.apply_chat_template(messages, chat_template=self.chat_template, **kw)


@pytest.mark.parametrize(
    "template, reason",
    [
        ("{{ raise_exception('no') }}", "cannot render a plain conversation"),
        ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", "no special token"),
        ("{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}", "texts"),
    ],
)
def test_unservable_templates_fail_at_detection_with_the_reason(template, reason):
    tok = _Tok(make_tokenizer("qwen3"), template)
    with pytest.raises(UnsupportedTemplate, match=reason):
        detect_profile(tok)


def test_adapt_gives_object_templates_objects_and_leaves_other_strings():
    coder = _profile("qwen3_coder")
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"path": "a.py"}'}}
    msg = {"role": "assistant", "content": "", "tool_calls": [call]}
    (m,) = coder.adapt([msg])
    assert m["tool_calls"][0]["function"]["arguments"] == {"path": "a.py"}
    not_json = {**msg, "tool_calls": [{**call, "function": {"name": "f", "arguments": "ls -la"}}]}
    assert coder.adapt([not_json])[0] is not_json
    plain = {"role": "user", "content": "hi"}
    assert coder.adapt([plain])[0] is plain
