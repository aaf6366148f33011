# ruff: noqa: E501  (chat templates are data: one Jinja statement per line reads better than wrapped strings)
"""gpt-oss (``gpt_oss``): the harmony format, written for this project from OpenAI's harmony
format description and the gpt-oss model card.

- Every message is ``<|start|>{header}<|message|>{body}`` plus an end token. The render opens
  with a system message (model identity, knowledge cutoff, ``Current date: `` from
  ``strftime_now``, ``Reasoning: {reasoning_effort}`` (default ``medium``), the valid channels,
  and with tools the line that routes ``functions`` calls to the commentary channel).
- A leading system message and the tool list become the developer message:
  ``# Instructions\\n\\n{text}`` and ``# Tools`` with a TypeScript-like ``namespace functions``.
  Later system messages render as developer messages in place.
- user: ``<|start|>user<|message|>{text}<|end|>``.
- assistant final answer: ``<|start|>assistant<|channel|>final<|message|>{content}`` closed by
  ``<|end|>`` in the history, but by ``<|return|>`` when it is the last message and no
  generation prompt follows (then its ``thinking`` renders first as an analysis message).
  The model itself ends a final answer with ``<|return|>``: the history re-renders the
  model's last turn differently.
- assistant tool call: ONE call per message (more raise); its ``thinking`` (or its content)
  renders as an analysis message ``<|start|>assistant<|channel|>analysis<|message|>...<|end|>``
  only while no later final answer exists (a later assistant message without a ``tool_calls``
  key); content and thinking together raise, with the words of gpt-oss's published
  chat_template.jinja ("Cannot pass both content and thinking in an assistant message with
  tool calls!"), which is what a client echoing a preamble (commentary before the call) meets;
  then
  ``<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{args}<|call|>``
  (``arguments`` through ``tojson``). The model emits the header the other harmony way round
  (``<|channel|>commentary to=functions.{name} <|constrain|>json``): again a re-render.
- tool result: ``<|start|>functions.{name of the last call} to=assistant<|channel|>commentary
  <|message|>{content | tojson}<|end|>`` (the output is JSON-quoted).
- reasoning field ``thinking``; generation prompt ``<|start|>assistant``.
- generation stops on ``<|return|>``, ``<|endoftext|>`` and ``<|call|>``; tokenizer eos is
  ``<|return|>``. All harmony tokens are special.
"""

from __future__ import annotations

import json

from proxy.chat import ParsedOutput
from trialflow.families._common import TEXT_MACRO, ExpectedProfile, FamilyFixture, FamilyTraits

CONTROL = (
    "<|startoftext|>",
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
)

TEMPLATE = (
    TEXT_MACRO
    + r"""
{%- macro ts_type(spec) -%}
    {%- if spec.type is not defined -%}{{- 'any' -}}
    {%- elif spec.type in ('integer', 'number') -%}{{- 'number' -}}
    {%- elif spec.type == 'array' -%}{{- 'any[]' -}}
    {%- elif spec.type in ('string', 'boolean', 'object') -%}{{- spec.type -}}
    {%- else -%}{{- 'any' -}}
    {%- endif -%}
{%- endmacro -%}
{%- macro tools_ts() -%}
    {{- '# Tools\n\n## functions\n\nnamespace functions {\n\n' -}}
    {%- for t in tools -%}
        {%- set f = t.function if t.function is defined else t -%}
        {{- '// ' + (f.description or '') + '\ntype ' + f.name + ' = ' -}}
        {%- if f.parameters is defined and f.parameters.properties -%}
            {{- '(_: {\n' -}}
            {%- for pname, spec in f.parameters.properties | items -%}
                {%- if spec.description is defined -%}{{- '// ' + spec.description + '\n' -}}{%- endif -%}
                {{- pname -}}
                {%- if pname not in (f.parameters.required or []) -%}{{- '?' -}}{%- endif -%}
                {{- ': ' + ts_type(spec) + ',\n' -}}
            {%- endfor -%}
            {{- '}) => any;\n\n' -}}
        {%- else -%}
            {{- '() => any;\n\n' -}}
        {%- endif -%}
    {%- endfor -%}
    {{- '} // namespace functions' -}}
{%- endmacro -%}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n' -}}
{{- 'Knowledge cutoff: 2024-06\nCurrent date: ' + strftime_now('%Y-%m-%d') + '\n\n' -}}
{{- 'Reasoning: ' + (reasoning_effort if reasoning_effort is defined else 'medium') + '\n\n' -}}
{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if tools -%}{{- "\nCalls to these tools must go to the commentary channel: 'functions'." -}}{%- endif -%}
{{- '<|end|>' -}}
{%- set has_system = messages and messages[0].role in ('system', 'developer') -%}
{%- if has_system or tools -%}
    {{- '<|start|>developer<|message|>' -}}
    {%- if has_system -%}{{- '# Instructions\n\n' + text(messages[0].content) -}}{%- endif -%}
    {%- if has_system and tools -%}{{- '\n\n' -}}{%- endif -%}
    {%- if tools -%}{{- tools_ts() -}}{%- endif -%}
    {{- '<|end|>' -}}
{%- endif -%}
{%- set ns = namespace(last_call='') -%}
{%- for m in messages -%}
    {%- if m.role in ('system', 'developer') -%}
        {%- if not loop.first -%}
            {{- '<|start|>developer<|message|># Instructions\n\n' + text(m.content) + '<|end|>' -}}
        {%- endif -%}
    {%- elif m.role == 'user' -%}
        {{- '<|start|>user<|message|>' + text(m.content) + '<|end|>' -}}
    {%- elif m.role == 'assistant' and m.tool_calls -%}
        {%- if m.tool_calls | length > 1 -%}
            {{- raise_exception('gpt-oss renders one tool call per assistant message') -}}
        {%- endif -%}
        {%- set later = namespace(final=false) -%}
        {%- for n in messages[loop.index0 + 1:] -%}
            {%- if n.role == 'assistant' and 'tool_calls' not in n -%}{%- set later.final = true -%}{%- endif -%}
        {%- endfor -%}
        {%- set content = text(m.content) -%}
        {%- if content and m.thinking -%}
            {{- raise_exception('Cannot pass both content and thinking in an assistant message with tool calls! Put the analysis message in one or the other, but not both.') -}}
        {%- elif (content or m.thinking) and not later.final -%}
            {{- '<|start|>assistant<|channel|>analysis<|message|>' + (content or m.thinking) + '<|end|>' -}}
        {%- endif -%}
        {%- set tc = m.tool_calls[0] -%}
        {%- set f = tc.function if tc.function is defined else tc -%}
        {{- '<|start|>assistant to=functions.' + f.name + '<|channel|>commentary json<|message|>' -}}
        {{- (f.arguments | tojson) + '<|call|>' -}}
        {%- set ns.last_call = f.name -%}
    {%- elif m.role == 'assistant' -%}
        {%- if loop.last and not add_generation_prompt -%}
            {%- if m.thinking -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + m.thinking + '<|end|>' -}}{%- endif -%}
            {{- '<|start|>assistant<|channel|>final<|message|>' + text(m.content) + '<|return|>' -}}
        {%- else -%}
            {{- '<|start|>assistant<|channel|>final<|message|>' + text(m.content) + '<|end|>' -}}
        {%- endif -%}
    {%- elif m.role == 'tool' -%}
        {{- '<|start|>functions.' + ns.last_call + ' to=assistant<|channel|>commentary<|message|>' -}}
        {{- (text(m.content) | tojson) + '<|end|>' -}}
    {%- else -%}
        {{- raise_exception('unknown role: ' + m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}
"""
)


def _output(p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    """The analysis channel first, then a ``commentary to=functions.NAME`` call ending in
    ``<|call|>`` or the final channel ending in ``<|return|>``."""
    r = p.reasoning or ""
    body = f"<|channel|>analysis<|message|>{r}<|end|><|start|>assistant" if r else ""
    if p.tool_calls:  # more than one is not what gpt-oss does (it stops at <|call|>), but a parser may see it
        body += "<|call|><|start|>assistant".join(
            f"<|channel|>commentary to=functions.{tc.name} <|constrain|>json<|message|>"
            f"{json.dumps(tc.arguments, separators=(',', ':'))}"
            for tc in p.tool_calls
        )
        return body, "<|call|>"
    return body + f"<|channel|>final<|message|>{p.content or ''}", "<|return|>"


GPT_OSS = FamilyFixture(
    "gpt_oss",
    TEMPLATE,
    CONTROL,
    (),
    eos_token="<|return|>",
    generation_eos=("<|return|>", "<|endoftext|>", "<|call|>"),
    pad_token="<|endoftext|>",
    traits=FamilyTraits(
        reasoning=True,
        thinks_by_default=True,
        parallel_calls=False,
        text_with_calls=False,
        profile=ExpectedProfile(
            "harmony", "harmony", "thinking", "reasoning_effort", "object", False, False, False
        ),
    ),
    native_output=_output,
)
