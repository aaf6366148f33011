# ruff: noqa: E501  (chat templates are data: one Jinja statement per line reads better than wrapped strings)
"""Llama-3.1 (``llama31``), written for this project from Meta's Llama 3.1 prompt-format docs.

- ``<|begin_of_text|>`` then a system header turn
  ``<|start_header_id|>system<|end_header_id|>\\n\\n``: ``Environment: ipython`` when tools or
  built-in tools are given, ``Tools: {builtin_tools}`` (without ``code_interpreter``), the
  ``Cutting Knowledge Date: December 2023`` / ``Today Date: {date_string}`` lines (default
  ``26 Jul 2024``), then the leading system message's text (trimmed), ``<|eot_id|>``.
- custom tools (``tools_in_user_message``, default true) are described as JSON in the FIRST
  user message, before its text (so the first message after the system turn must exist).
- every message: ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{text | trim}<|eot_id|>``.
- assistant tool call: exactly ONE per message (parallel calls raise: "This model only supports
  single tool-calls at once!"); its text is dropped; a custom tool renders as
  ``{"name": ..., "parameters": {arguments | tojson}}``; a built-in tool as
  ``<|python_tag|>{name}.call(k="v", ...)``. With ``builtin_tools`` given, every tool-call turn
  ends with ``<|eom_id|>`` (the model expects a tool result), otherwise ``<|eot_id|>``.
- tool results: ``<|start_header_id|>ipython<|end_header_id|>\\n\\n{content}<|eot_id|>`` (a
  non-string content through ``tojson``).
- generation prompt ``<|start_header_id|>assistant<|end_header_id|>\\n\\n``; no reasoning.
- tokenizer eos ``<|eot_id|>``; generation stops on ``<|end_of_text|>``, ``<|eom_id|>`` and
  ``<|eot_id|>``. All these tokens are special.
"""

from __future__ import annotations

import json

from proxy.chat import ParsedOutput
from trialflow.families._common import TEXT_MACRO, ExpectedProfile, FamilyFixture, FamilyTraits

CONTROL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)

TEMPLATE = (
    TEXT_MACRO
    + r"""
{%- set date_string = date_string if date_string is defined else '26 Jul 2024' -%}
{%- set tools_in_user = tools_in_user_message if tools_in_user_message is defined else true -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = text(messages[0].content) | trim -%}
    {%- set rest = messages[1:] -%}
{%- else -%}
    {%- set system_text = '' -%}
    {%- set rest = messages -%}
{%- endif -%}
{{- bos_token + '<|start_header_id|>system<|end_header_id|>\n\n' -}}
{%- if builtin_tools is defined or tools -%}{{- 'Environment: ipython\n' -}}{%- endif -%}
{%- if builtin_tools is defined -%}
    {{- 'Tools: ' + (builtin_tools | reject('equalto', 'code_interpreter') | join(', ')) + '\n\n' -}}
{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\nToday Date: ' + date_string + '\n\n' -}}
{%- if tools and not tools_in_user -%}
    {{- 'You have access to the following functions. To call a function, please respond with JSON for a ' -}}
    {{- 'function call. Respond in the format {"name": function name, "parameters": dictionary of argument ' -}}
    {{- 'name and its value}. Do not use variables.\n\n' -}}
    {%- for t in tools -%}{{- (t | tojson(indent=4)) + '\n\n' -}}{%- endfor -%}
{%- endif -%}
{{- system_text + '<|eot_id|>' -}}
{%- if tools and tools_in_user and messages -%}
    {%- if not rest -%}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") -}}
    {%- endif -%}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- 'Given the following functions, please respond with a JSON for a function call with its proper ' -}}
    {{- 'arguments that best answers the given prompt.\n\nRespond in the format {"name": function name, ' -}}
    {{- '"parameters": dictionary of argument name and its value}. Do not use variables.\n\n' -}}
    {%- for t in tools -%}{{- (t | tojson(indent=4)) + '\n\n' -}}{%- endfor -%}
    {{- (text(rest[0].content) | trim) + '<|eot_id|>' -}}
    {%- set rest = rest[1:] -%}
{%- endif -%}
{%- for m in rest -%}
    {%- if m.role == 'assistant' and m.tool_calls -%}
        {%- if m.tool_calls | length != 1 -%}
            {{- raise_exception('This model only supports single tool-calls at once!') -}}
        {%- endif -%}
        {%- set tc = m.tool_calls[0] -%}
        {%- set f = tc.function if tc.function is defined else tc -%}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {%- if builtin_tools is defined and f.name in builtin_tools -%}
            {{- '<|python_tag|>' + f.name + '.call(' -}}
            {%- for k, v in f.arguments | items -%}
                {{- k + '="' + v + '"' -}}{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}
            {%- endfor -%}
            {{- ')' -}}
        {%- else -%}
            {{- '{"name": "' + f.name + '", "parameters": ' + (f.arguments | tojson) + '}' -}}
        {%- endif -%}
        {%- if builtin_tools is defined -%}{{- '<|eom_id|>' -}}{%- else -%}{{- '<|eot_id|>' -}}{%- endif -%}
    {%- elif m.role in ('tool', 'ipython') -%}
        {{- '<|start_header_id|>ipython<|end_header_id|>\n\n' -}}
        {%- if m.content is string -%}{{- m.content -}}{%- else -%}{{- m.content | tojson -}}{%- endif -%}
        {{- '<|eot_id|>' -}}
    {%- else -%}
        {{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + (text(m.content) | trim) + '<|eot_id|>' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""
)

# Built-in tools the model calls in its python-tag form (``name.call(k="v")``, ending in <|eom_id|>).
BUILTIN_TOOLS = ("brave_search", "wolfram_alpha")


def _output(p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    """One JSON call ``{"name", "parameters"}`` per turn (a built-in tool in its python-tag
    form), or plain text."""
    calls = p.tool_calls
    if len(calls) > 1:  # Llama-3.1 emits one call per turn; "; "-joined JSON is seen in the wild
        return "; ".join(
            json.dumps({"name": tc.name, "parameters": tc.arguments}) for tc in calls
        ), "<|eot_id|>"
    if calls:
        (tc,) = calls
        if tc.name in BUILTIN_TOOLS:
            args = ", ".join(f'{k}="{v}"' for k, v in tc.arguments.items())
            return f"<|python_tag|>{tc.name}.call({args})", "<|eom_id|>"
        return json.dumps({"name": tc.name, "parameters": tc.arguments}), "<|eot_id|>"
    return p.content or "", "<|eot_id|>"


LLAMA31 = FamilyFixture(
    "llama31",
    TEMPLATE,
    CONTROL,
    (),
    eos_token="<|eot_id|>",
    generation_eos=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    pad_token="<|finetune_right_pad_id|>",
    bos_token="<|begin_of_text|>",
    traits=FamilyTraits(
        reasoning=False,
        thinks_by_default=False,
        parallel_calls=False,
        text_with_calls=False,
        profile=ExpectedProfile("llama3_json", None, None, None, "object", False, False, True),
    ),
    native_output=_output,
)
