# ruff: noqa: E501  (chat templates are data: one Jinja statement per line reads better than wrapped strings)
"""Qwen2.5, Qwen3 and Qwen3-Coder: ChatML turns, each family with its own tool and reasoning rules.

Written for this project from the families' model cards and documented chat formats (not
copied from their published templates). What each reproduces:

Qwen2.5 (``qwen25``)
- ``<|im_start|>{role}\\n{text}<|im_end|>\\n``; without a leading system message a default one
  ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.") is rendered.
- tools: JSON lines inside ``<tools></tools>`` appended to the (default) system turn.
- tool calls: ``\\n<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` per call after
  the text; ``arguments`` always goes through ``tojson`` (a string is JSON-quoted again).
- consecutive tool results share ONE user turn, each ``\\n<tool_response>\\n...\\n</tool_response>``:
  the ``<|im_end|>`` of a tool result depends on whether the next message is a tool result.
- no reasoning; mid-conversation system messages render as system turns.

Qwen3 (``qwen3``) as Qwen2.5 without the default system prompt, plus:
- the last user *query* is the last user message that is not a ``<tool_response>`` wrapper;
  a conversation without one raises ("No user query found in messages.").
- assistant reasoning (``reasoning_content``, or a ``<think>...</think>`` prefix of the content)
  renders as ``<think>\\n{r}\\n</think>\\n\\n`` only for assistant messages after the last query,
  and there only when non-empty -- except the LAST message, which always gets the block (an
  empty ``<think>\\n\\n</think>\\n\\n`` when it has no reasoning). Earlier turns lose theirs.
- string ``arguments`` are inserted verbatim, objects through ``tojson``.
- ``enable_thinking=False`` appends an empty think block to the generation prompt.

Qwen3-Coder (``qwen3_coder``): ChatML, no reasoning; tools described as XML ``<function>``
blocks; without a system message but with tools, a default system prompt; calls as
``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``
(string values verbatim, others ``tojson``; ``arguments`` must be a mapping: a string raises);
tool results grouped in one user turn, each ``<tool_response>\\n...\\n</tool_response>\\n``.

All three: tokenizer eos ``<|im_end|>``; generation stops on ``<|im_end|>`` and ``<|endoftext|>``.
"""

from __future__ import annotations

import json

from proxy.chat import ParsedOutput
from trialflow.families._common import (
    HERMES_TOOLS_MACRO,
    SPLIT_REASONING,
    TEXT_MACRO,
    ExpectedProfile,
    FamilyFixture,
    FamilyTraits,
)

CONTROL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
GEN_EOS = ("<|im_end|>", "<|endoftext|>")

# Consecutive tool results share one user turn (the grouping looks at both neighbours).
_GROUPED_TOOL = r"""
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + text(m.content) + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
""".strip()

QWEN25_TEMPLATE = (
    TEXT_MACRO
    + HERMES_TOOLS_MACRO
    + r"""
{%- set default_system = 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' + (text(messages[0].content) if has_system else default_system) -}}
    {{- '\n\n' + tools_block() + '<|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- else -%}
    {{- '<|im_start|>system\n' + default_system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
    {%- if m.role == 'system' and loop.first -%}
    {%- elif m.role in ('user', 'system') or (m.role == 'assistant' and not m.tool_calls) -%}
        {{- '<|im_start|>' + m.role + '\n' + text(m.content) + '<|im_end|>\n' -}}
    {%- elif m.role == 'assistant' -%}
        {{- '<|im_start|>assistant' -}}
        {%- if text(m.content) -%}{{- '\n' + text(m.content) -}}{%- endif -%}
        {%- for tc in m.tool_calls -%}
            {%- set f = tc.function if tc.function is defined else tc -%}
            {{- '\n<tool_call>\n{"name": "' + f.name + '", "arguments": ' + (f.arguments | tojson) -}}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'tool' -%}
"""
    + _GROUPED_TOOL
    + r"""
    {%- else -%}
        {{- raise_exception('unknown role: ' + m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
)

QWEN3_TEMPLATE = (
    TEXT_MACRO
    + HERMES_TOOLS_MACRO
    + r"""
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if messages and messages[0].role == 'system' -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
    {{- tools_block() + '<|im_end|>\n' -}}
{%- elif messages and messages[0].role == 'system' -%}
    {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- set ns = namespace(last_query=-1) -%}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {%- set c = text(m.content) -%}
        {%- if not (c.startswith('<tool_response>') and c.endswith('</tool_response>')) -%}
            {%- set ns.last_query = loop.index0 -%}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
{%- if messages and ns.last_query < 0 -%}{{- raise_exception('No user query found in messages.') -}}{%- endif -%}
{%- for m in messages -%}
    {%- if m.role == 'system' and loop.first -%}
    {%- elif m.role in ('user', 'system') -%}
        {{- '<|im_start|>' + m.role + '\n' + text(m.content) + '<|im_end|>\n' -}}
    {%- elif m.role == 'assistant' -%}
"""
    + SPLIT_REASONING
    + r"""
        {{- '<|im_start|>assistant\n' -}}
        {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}
            {{- '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') -}}
        {%- else -%}
            {{- content -}}
        {%- endif -%}
        {%- if m.tool_calls -%}
            {%- for tc in m.tool_calls -%}
                {%- set f = tc.function if tc.function is defined else tc -%}
                {%- if (loop.first and content) or not loop.first -%}{{- '\n' -}}{%- endif -%}
                {{- '<tool_call>\n{"name": "' + f.name + '", "arguments": ' -}}
                {%- if f.arguments is string -%}{{- f.arguments -}}{%- else -%}{{- f.arguments | tojson -}}{%- endif -%}
                {{- '}\n</tool_call>' -}}
            {%- endfor -%}
        {%- endif -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'tool' -%}
"""
    + _GROUPED_TOOL
    + r"""
    {%- else -%}
        {{- raise_exception('unknown role: ' + m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
)

QWEN3_CODER_TEMPLATE = (
    TEXT_MACRO
    + r"""
{%- macro value(v) -%}{%- if v is string -%}{{- v -}}{%- else -%}{{- v | tojson -}}{%- endif -%}{%- endmacro -%}
{%- macro tools_block() -%}
    {{- '# Tools\n\nYou have access to the following functions:\n\n<tools>' -}}
    {%- for t in tools -%}
        {%- set f = t.function if t.function is defined else t -%}
        {{- '\n<function>\n<name>' + f.name + '</name>' -}}
        {%- if f.description -%}{{- '\n<description>' + f.description + '</description>' -}}{%- endif -%}
        {{- '\n<parameters>' -}}
        {%- if f.parameters is defined and f.parameters.properties is defined -%}
            {%- for pname, spec in f.parameters.properties | items -%}
                {{- '\n<parameter>\n<name>' + pname + '</name>' -}}
                {%- if spec.type is defined -%}{{- '\n<type>' + value(spec.type) + '</type>' -}}{%- endif -%}
                {%- if spec.description is defined -%}{{- '\n<description>' + spec.description + '</description>' -}}{%- endif -%}
                {{- '\n</parameter>' -}}
            {%- endfor -%}
        {%- endif -%}
        {%- if f.parameters is defined and f.parameters.required is defined -%}
            {{- '\n<required>' + (f.parameters.required | tojson) + '</required>' -}}
        {%- endif -%}
        {{- '\n</parameters>\n</function>' -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n' -}}
    {{- '<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n' -}}
    {{- '</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n' -}}
    {{- '- Function calls MUST follow the specified format: an inner <function=...></function> block ' -}}
    {{- 'must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n' -}}
    {{- '- You may provide optional reasoning for your function call in natural language BEFORE the ' -}}
    {{- 'function call, but NOT after\n</IMPORTANT>' -}}
{%- endmacro -%}
{%- set has_system = messages and messages[0].role == 'system' -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if has_system -%}{{- text(messages[0].content) -}}
    {%- else -%}{{- 'You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks.' -}}
    {%- endif -%}
    {{- '\n\n' + tools_block() + '<|im_end|>\n' -}}
{%- elif has_system -%}
    {{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for m in messages -%}
    {%- if m.role == 'system' and loop.first -%}
    {%- elif m.role in ('user', 'system') or (m.role == 'assistant' and not m.tool_calls) -%}
        {{- '<|im_start|>' + m.role + '\n' + text(m.content) + '<|im_end|>\n' -}}
    {%- elif m.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' + text(m.content) -}}
        {%- for tc in m.tool_calls -%}
            {%- set f = tc.function if tc.function is defined else tc -%}
            {%- if loop.first and text(m.content) -%}{{- '\n\n' -}}{%- elif not loop.first -%}{{- '\n' -}}{%- endif -%}
            {{- '<tool_call>\n<function=' + f.name + '>\n' -}}
            {%- for k, v in f.arguments | items -%}
                {{- '<parameter=' + k + '>\n' + value(v) + '\n</parameter>\n' -}}
            {%- endfor -%}
            {{- '</function>\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif m.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user\n' -}}{%- endif -%}
        {{- '<tool_response>\n' + text(m.content) + '\n</tool_response>\n' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- else -%}
        {{- raise_exception('unknown role: ' + m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""
)


def hermes_output(p: ParsedOutput, *, reasons: bool) -> tuple[str, str]:
    """Qwen2.5 / Qwen3 (and the tiny model): a think block first (Qwen3), then text, then each
    call as JSON in ``<tool_call>`` tags, one per line."""
    body = (f"<think>\n{p.reasoning}\n</think>\n\n" if p.reasoning and reasons else "") + (p.content or "")
    for i, tc in enumerate(p.tool_calls):
        sep = "\n" if (p.content or i) else ""
        call = json.dumps({"name": tc.name, "arguments": tc.arguments})
        body += f"{sep}<tool_call>\n{call}\n</tool_call>"
    return body, "<|im_end|>"


def _qwen25_output(p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    return hermes_output(p, reasons=False)


def _qwen3_output(p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    return hermes_output(p, reasons=True)


def _qwen3_coder_output(p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    """Qwen3-Coder's XML calls: ``<function=NAME>`` with one ``<parameter=KEY>`` per argument."""
    body = p.content or ""
    for i, tc in enumerate(p.tool_calls):
        body += "\n\n" if (i == 0 and p.content) else "\n" if i else ""
        params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in tc.arguments.items())
        body += f"<tool_call>\n<function={tc.name}>\n{params}</function>\n</tool_call>"
    return body, "<|im_end|>"


_NO_REASONING = FamilyTraits(
    reasoning=False,
    thinks_by_default=False,
    parallel_calls=True,
    text_with_calls=True,
    profile=ExpectedProfile("hermes", None, None, None, "object", True, False, True),
)
QWEN25 = FamilyFixture(
    "qwen25",
    QWEN25_TEMPLATE,
    CONTROL,
    MARKUP,
    "<|im_end|>",
    GEN_EOS,
    "<|endoftext|>",
    traits=_NO_REASONING,
    native_output=_qwen25_output,
)
QWEN3 = FamilyFixture(
    "qwen3",
    QWEN3_TEMPLATE,
    CONTROL,
    MARKUP,
    "<|im_end|>",
    GEN_EOS,
    "<|endoftext|>",
    traits=FamilyTraits(
        reasoning=True,
        thinks_by_default=True,
        parallel_calls=True,
        text_with_calls=True,
        profile=ExpectedProfile(
            "hermes", "think", "reasoning_content", "enable_thinking", "object", True, False, True
        ),
    ),
    native_output=_qwen3_output,
)
QWEN3_CODER = FamilyFixture(
    "qwen3_coder",
    QWEN3_CODER_TEMPLATE,
    CONTROL,
    MARKUP,
    "<|im_end|>",
    GEN_EOS,
    "<|endoftext|>",
    traits=FamilyTraits(
        reasoning=False,
        thinks_by_default=False,
        parallel_calls=True,
        text_with_calls=True,
        profile=ExpectedProfile("qwen3_coder", None, None, None, "object", True, False, True),
    ),
    native_output=_qwen3_coder_output,
)
