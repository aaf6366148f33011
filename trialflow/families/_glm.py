# ruff: noqa: E501  (chat templates are data: one Jinja statement per line reads better than wrapped strings)
"""GLM-4.5 / GLM-4.6 (``glm45``), written for this project from the documented GLM-4.5 chat format.

- The render opens with ``[gMASK]<sop>``. Turns have NO closing token: each starts with its
  role token (``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|observation|>``) and ends
  where the next one starts. The model ends its turn by generating the next role token:
  generation stops on ``<|endoftext|>``, ``<|user|>`` and ``<|observation|>``
  (generation_config), so its last token is also the first token of the rendered continuation.
- tools: a ``<|system|>`` block right after the prefix, JSON lines inside ``<tools></tools>``.
- user: ``<|user|>\\n{text}``; with ``enable_thinking=False`` the text gets ``/nothink``
  appended (unless it already ends with it).
- assistant: ``<|assistant|>`` then ``\\n<think>{reasoning}</think>`` for messages after the last
  user message that have reasoning, else an empty ``\\n<think></think>`` (reasoning of turns
  before the last user message is dropped); then ``\\n{content}`` when non-empty (stripped);
  then per call ``\\n<tool_call>{name}`` + ``\\n<arg_key>{k}</arg_key>\\n<arg_value>{v}</arg_value>``
  per argument (strings verbatim, others ``tojson``; arguments must be a mapping) +
  ``\\n</tool_call>``.
- tool results: the first of a run opens ``<|observation|>``; each is
  ``\\n<tool_response>\\n{text}\\n</tool_response>``.
- generation prompt ``<|assistant|>`` (plus ``\\n<think></think>`` when thinking is off).
- The think and tool markup tokens are special tokens (a ``skip_special_tokens`` decode drops
  them), as in the released tokenizer.
"""

from __future__ import annotations

from proxy.chat import ParsedOutput
from trialflow.families._common import (
    SPLIT_REASONING,
    TEXT_MACRO,
    ExpectedProfile,
    FamilyFixture,
    FamilyTraits,
)

CONTROL = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
MARKUP = ("/nothink",)

TEMPLATE = (
    TEXT_MACRO
    + r"""
{%- set thinking_off = enable_thinking is defined and enable_thinking is false -%}
{{- '[gMASK]<sop>' -}}
{%- if tools -%}
    {{- '<|system|>\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n' -}}
    {%- for t in tools -%}{{- (t | tojson) + '\n' -}}{%- endfor -%}
    {{- '</tools>\n\nFor each function call, output the function name and arguments within the following XML format:' -}}
    {{- '\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n' -}}
    {{- '<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n...\n</tool_call>' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {%- set c = text(m.content) -%}
        {{- '<|user|>\n' + c -}}
        {%- if thinking_off and not c.endswith('/nothink') -%}{{- '/nothink' -}}{%- endif -%}
    {%- elif m.role == 'assistant' -%}
"""
    + SPLIT_REASONING
    + r"""
        {{- '<|assistant|>' -}}
        {%- if loop.index0 > ns.last_user and reasoning -%}
            {{- '\n<think>' + reasoning.strip() + '</think>' -}}
        {%- else -%}
            {{- '\n<think></think>' -}}
        {%- endif -%}
        {%- if content.strip() -%}{{- '\n' + content.strip() -}}{%- endif -%}
        {%- for tc in m.tool_calls or [] -%}
            {%- set f = tc.function if tc.function is defined else tc -%}
            {{- '\n<tool_call>' + f.name -}}
            {%- for k, v in f.arguments.items() -%}
                {{- '\n<arg_key>' + k + '</arg_key>\n<arg_value>' -}}
                {%- if v is string -%}{{- v -}}{%- else -%}{{- v | tojson -}}{%- endif -%}
                {{- '</arg_value>' -}}
            {%- endfor -%}
            {{- '\n</tool_call>' -}}
        {%- endfor -%}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text(m.content) + '\n</tool_response>' -}}
    {%- elif m.role == 'system' -%}
        {{- '<|system|>\n' + text(m.content) -}}
    {%- else -%}
        {{- raise_exception('unknown role: ' + m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|assistant|>' -}}
    {%- if thinking_off -%}{{- '\n<think></think>' -}}{%- endif -%}
{%- endif -%}
"""
)


def _output(p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    """A think block (empty when none), text, then each call as ``<tool_call>NAME`` with
    ``<arg_key>``/``<arg_value>`` pairs; a call turn ends on ``<|observation|>``, any other
    on ``<|user|>`` (the next turn's opener: the model stops where the next speaker starts)."""
    body = f"\n<think>{p.reasoning or ''}</think>" + (f"\n{p.content}" if p.content else "")
    for tc in p.tool_calls:
        args = "".join(
            f"\n<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>" for k, v in tc.arguments.items()
        )
        body += f"\n<tool_call>{tc.name}{args}\n</tool_call>"
    return body, "<|observation|>" if p.tool_calls else "<|user|>"


GLM45 = FamilyFixture(
    "glm45",
    TEMPLATE,
    CONTROL,
    MARKUP,
    eos_token="<|endoftext|>",
    generation_eos=("<|endoftext|>", "<|user|>", "<|observation|>"),
    pad_token="<|endoftext|>",
    traits=FamilyTraits(
        reasoning=True,
        thinks_by_default=True,
        parallel_calls=True,
        text_with_calls=True,
        profile=ExpectedProfile(
            "glm45", "think", "reasoning_content", "enable_thinking", "object", True, True, True
        ),
    ),
    native_output=_output,
)
