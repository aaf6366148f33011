"""The family fixtures reproduce the rules their docstrings state (trialflow.families)."""

from __future__ import annotations

import json

import pytest

from trialflow.families import FAMILIES, build_tokenizer_dir, family, make_tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "Bash",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]


def _call(args, name="Bash"):
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}


def _render(tok, messages, *, gen=False, tools=None, **kw):
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen, **kw)


@pytest.fixture(scope="module")
def toks():
    return {name: make_tokenizer(name) for name in FAMILIES}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_tokens_are_single_ids_with_the_documented_special_flag(toks, name):
    fx, tok = family(name), toks[name]
    special = set(tok.all_special_tokens) | {
        t.content for t in tok.added_tokens_decoder.values() if t.special
    }
    for t in fx.all_tokens:
        ids = tok.encode(t, add_special_tokens=False)
        assert len(ids) == 1, (t, ids)
        assert (t in special) == (t in fx.control_tokens), t
    assert tok.eos_token == fx.eos_token
    for t in fx.generation_eos:
        assert t in fx.control_tokens


def test_build_tokenizer_dir_writes_generation_eos_list(tmp_path):
    from transformers import AutoTokenizer

    out = build_tokenizer_dir("glm45", tmp_path / "glm")
    tok = AutoTokenizer.from_pretrained(out)
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [tok.convert_tokens_to_ids(t) for t in family("glm45").generation_eos]
    assert build_tokenizer_dir("glm45", out) == out  # reused
    assert tok.chat_template == family("glm45").chat_template


def test_unknown_family_lists_names():
    with pytest.raises(KeyError, match="qwen3"):
        family("nope")


def test_qwen3_last_assistant_gets_empty_think_block_earlier_ones_lose_reasoning(toks):
    tok = toks["qwen3"]
    a = {"role": "assistant", "content": "hi"}
    conv = [{"role": "user", "content": "u"}, a]
    assert _render(tok, conv).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nhi<|im_end|>\n")
    later = _render(tok, [*conv, {"role": "user", "content": "v"}])
    assert "<|im_start|>assistant\nhi<|im_end|>" in later
    r = {"role": "assistant", "content": "x", "reasoning_content": "why"}
    loop = [{"role": "user", "content": "u"}, r, {"role": "tool", "content": "out"}]
    assert "<think>\nwhy\n</think>" in _render(tok, loop)
    assert "why" not in _render(tok, [*loop, {"role": "user", "content": "next"}])
    with pytest.raises(Exception, match="No user query"):
        _render(tok, [{"role": "system", "content": "s"}, a])


def test_qwen_tool_results_share_one_user_turn(toks):
    for name in ("qwen25", "qwen3", "qwen3_coder"):
        tok = toks[name]
        msgs = [
            {"role": "user", "content": "u"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [_call({"command": "a"}), _call({"command": "b"})],
            },
            {"role": "tool", "content": "A"},
            {"role": "tool", "content": "B"},
        ]
        out = _render(tok, msgs, tools=TOOLS)
        assert out.count("<|im_start|>user") == 2, name
        assert out.count("<tool_response>") == 2


def test_glm_turns_have_no_closer_and_tool_results_open_with_observation(toks):
    tok = toks["glm45"]
    msgs = [
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "r",
            "tool_calls": [_call({"command": "ls"})],
        },
        {"role": "tool", "content": "out"},
    ]
    out = _render(tok, msgs, gen=True, tools=TOOLS)
    assert out.endswith(
        "<|assistant|>\n<think>r</think>\n<tool_call>Bash\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>"
        "\n</tool_call><|observation|>\n<tool_response>\nout\n</tool_response><|assistant|>"
    )
    assert "<think></think>" in _render(tok, [*msgs, {"role": "user", "content": "v"}])
    assert _render(tok, [{"role": "user", "content": "u"}], gen=True, enable_thinking=False).endswith(
        "u/nothink<|assistant|>\n<think></think>"
    )


def test_deepseek_concatenates_arguments_and_drops_reasoning(toks):
    tok = toks["deepseek_v31"]
    msgs = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "", "tool_calls": [_call({"a": 1})]},
    ]
    with pytest.raises(TypeError):
        _render(tok, msgs)
    msgs[1]["tool_calls"] = [_call('{"a": 1}')]
    tail = [{"role": "tool", "content": "out"}]
    out = _render(tok, [*msgs, *tail], gen=True)
    assert out.endswith(
        '<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
        "<｜tool▁output▁begin｜>out<｜tool▁output▁end｜>"
    )
    thinking = _render(tok, [{"role": "user", "content": "u"}], gen=True, thinking=True)
    assert thinking.endswith("<｜User｜>u<｜Assistant｜><think>")
    r = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "c", "reasoning_content": "why"}]
    assert "why" not in _render(tok, r)


def test_gpt_oss_final_closes_with_return_only_when_last(toks):
    tok = toks["gpt_oss"]
    conv = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "c", "thinking": "t"}]
    assert _render(tok, conv).endswith(
        "<|channel|>analysis<|message|>t<|end|><|start|>assistant<|channel|>final<|message|>c<|return|>"
    )
    later = _render(tok, [*conv, {"role": "user", "content": "v"}])
    assert "final<|message|>c<|end|>" in later and "<|channel|>analysis" not in later
    call = {"role": "assistant", "content": "", "thinking": "t", "tool_calls": [_call({"command": "ls"})]}
    out = _render(tok, [conv[0], call, {"role": "tool", "content": "o"}], gen=True, tools=TOOLS)
    assert out.endswith(
        '<|start|>assistant to=functions.Bash<|channel|>commentary json<|message|>{"command": "ls"}<|call|>'
        '<|start|>functions.Bash to=assistant<|channel|>commentary<|message|>"o"<|end|><|start|>assistant'
    )
    with pytest.raises(Exception, match="one tool call"):
        _render(tok, [conv[0], {**call, "tool_calls": [_call({}), _call({})]}])


def test_llama_raises_on_parallel_calls_and_ends_builtin_turns_with_eom(toks):
    tok = toks["llama31"]
    msgs = [{"role": "user", "content": "u"}, {"role": "assistant", "tool_calls": [_call({}), _call({})]}]
    with pytest.raises(Exception, match="single tool-calls"):
        _render(tok, msgs, tools=TOOLS)
    one = [
        {"role": "user", "content": "u"},
        {"role": "assistant", "tool_calls": [_call({"query": "x"}, "brave_search")]},
    ]
    out = _render(tok, one, builtin_tools=["brave_search", "wolfram_alpha"])
    assert out.endswith('<|python_tag|>brave_search.call(query="x")<|eom_id|>')
    assert "Tools: brave_search, wolfram_alpha" in out
    assert _render(tok, one).endswith("<|eot_id|>")


def test_rewrite_counts_reach_the_report_inspect_and_verl_fields():
    """Client vs template-forced rewrites are shown apart wherever trials are looked at."""
    from proxy.trajectory import Trajectory
    from trialflow.inspection import counters_text
    from trialflow.report import render_report
    from trialflow.verl.convert import ConvertConfig, convert_trial, extra_fields
    from workflows.shared import TrialResult

    result = TrialResult(
        trial_id="t1",
        batch_id="b",
        task_name="task",
        scaffold="s",
        sample_index=0,
        termination_reason="submitted",
        rewrites_client=2,
        rewrites_template=1,
    )
    doc = render_report([result], title="b")
    assert 'new segments: client rewrites</td><td class="num">2' in doc
    assert 'new segments: template-forced</td><td class="num">1' in doc
    assert ">2/1<" in doc
    traj = Trajectory(session_id="s")
    traj.counters.rewrites_client, traj.counters.rewrites_template = 2, 1
    assert "rewrites: client 2 template 1" in counters_text(traj).plain
    converted = convert_trial(None, result, ConvertConfig(prompt_length=8, response_length=8))
    fields = extra_fields(converted, converted.primary, result)
    assert (fields["rewrites_client"], fields["rewrites_template"]) == (2, 1)
