# ruff: noqa: E501  (chat templates are data: one Jinja statement per line reads better than wrapped strings)
"""DeepSeek-V3.1 (``deepseek_v31``), written for this project from the model card's chat format.

- ``{bos}{system}``: every system message's text, joined by ``\\n\\n`` and hoisted to the top
  (a system message in the middle of the conversation moves there too); with tools, a
  ``## Tools`` description follows (name, description, JSON parameters, the call format).
- user: ``<｜User｜>{text}``. The first assistant message after a user message opens with
  ``<｜Assistant｜></think>``: reasoning is never rendered in the history.
- assistant text: ``{content}<｜end▁of▁sentence｜>`` (a ``<think>...</think>`` prefix is cut off).
- tool calls: ``{content}<｜tool▁calls▁begin｜>`` then per call
  ``<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{arguments}<｜tool▁call▁end｜>`` then
  ``<｜tool▁calls▁end｜><｜end▁of▁sentence｜>``. ``arguments`` is CONCATENATED as a string: an
  object raises (``TypeError``).
- tool results: ``<｜tool▁output▁begin｜>{text}<｜tool▁output▁end｜>`` each. The assistant message
  after tool results opens with nothing, and the generation prompt after a tool result is
  empty: the model continues right after ``<｜tool▁output▁end｜>``.
- generation prompt after a user message: ``<｜Assistant｜>`` plus ``</think>`` (``thinking``
  false or unset, the default) or ``<think>`` (``thinking=True``).
- One end token: ``<｜end▁of▁sentence｜>`` (tokenizer eos and generation_config).
"""

from __future__ import annotations

import json

from proxy.chat import ParsedOutput
from trialflow.families._common import TEXT_MACRO, ExpectedProfile, FamilyFixture, FamilyTraits

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
CONTROL = (BOS, EOS, "<｜▁pad▁｜>")
MARKUP = (
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
)

TEMPLATE = (
    TEXT_MACRO
    + r"""
{%- set thinking = thinking if thinking is defined else false -%}
{%- set ns = namespace(system='', first_system=true, last_user=false, after_tool=false) -%}
{%- for m in messages -%}
    {%- if m.role == 'system' -%}
        {%- set ns.system = (text(m.content) if ns.first_system else ns.system + '\n\n' + text(m.content)) -%}
        {%- set ns.first_system = false -%}
    {%- endif -%}
{%- endfor -%}
{%- if tools -%}
    {%- set ns.system = (ns.system + '\n\n' if ns.system else '') + '## Tools\nYou have access to the following tools:\n' -%}
    {%- for t in tools -%}
        {%- set f = t.function if t.function is defined else t -%}
        {%- set ns.system = ns.system + '\n### ' + f.name + '\nDescription: ' + (f.description or '') -%}
        {%- set ns.system = ns.system + '\n\nParameters: ' + (f.parameters | tojson) + '\n' -%}
    {%- endfor -%}
    {%- set ns.system = ns.system + '\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\n' -%}
    {%- set ns.system = ns.system + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>' -%}
    {%- set ns.system = ns.system + 'tool_call_arguments<｜tool▁call▁end｜>{additional_tool_calls}<｜tool▁calls▁end｜>\n\n' -%}
    {%- set ns.system = ns.system + 'Where:\n- `tool_call_name` must be an exact match to one of the available tools\n' -%}
    {%- set ns.system = ns.system + "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n" -%}
    {%- set ns.system = ns.system + '- For multiple tool calls, chain them directly without separators or spaces' -%}
{%- endif -%}
{{- bos_token + ns.system -}}
{%- for m in messages -%}
    {%- if m.role == 'user' -%}
        {{- '<｜User｜>' + text(m.content) -}}
        {%- set ns.last_user = true -%}{%- set ns.after_tool = false -%}
    {%- elif m.role == 'assistant' -%}
        {%- if ns.last_user -%}{{- '<｜Assistant｜></think>' -}}{%- endif -%}
        {%- set ns.last_user = false -%}
        {%- set content = text(m.content) -%}
        {%- if '</think>' in content -%}{%- set content = content.split('</think>', 1)[1] -%}{%- endif -%}
        {%- if m.tool_calls -%}
            {{- content + '<｜tool▁calls▁begin｜>' -}}
            {%- for tc in m.tool_calls -%}
                {%- set f = tc.function if tc.function is defined else tc -%}
                {{- '<｜tool▁call▁begin｜>' + f.name + '<｜tool▁sep｜>' + f.arguments + '<｜tool▁call▁end｜>' -}}
            {%- endfor -%}
            {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' -}}
        {%- else -%}
            {{- content + '<｜end▁of▁sentence｜>' -}}
        {%- endif -%}
        {%- set ns.after_tool = false -%}
    {%- elif m.role == 'tool' -%}
        {{- '<｜tool▁output▁begin｜>' + text(m.content) + '<｜tool▁output▁end｜>' -}}
        {%- set ns.last_user = false -%}{%- set ns.after_tool = true -%}
    {%- elif m.role != 'system' -%}
        {{- raise_exception('unknown role: ' + m.role) -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.last_user and not ns.after_tool -%}
    {{- '<｜Assistant｜>' + ('<think>' if thinking else '</think>') -}}
{%- endif -%}
"""
)


def _output(p: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
    """In thinking mode the prompt ends in ``<think>``: the model writes its reasoning and
    closes it; then text, then the calls between ``<｜tool▁calls▁begin｜>`` markers with JSON
    arguments."""
    body = (f"{p.reasoning}</think>" if thinking and p.reasoning else "") + (p.content or "")
    if p.tool_calls:
        body += "<｜tool▁calls▁begin｜>" + "".join(
            f"<｜tool▁call▁begin｜>{tc.name}<｜tool▁sep｜>{json.dumps(tc.arguments)}<｜tool▁call▁end｜>"
            for tc in p.tool_calls
        )
        body += "<｜tool▁calls▁end｜>"
    return body, EOS


DEEPSEEK_V31 = FamilyFixture(
    "deepseek_v31",
    TEMPLATE,
    CONTROL,
    MARKUP,
    eos_token=EOS,
    generation_eos=(EOS,),
    pad_token="<｜▁pad▁｜>",
    bos_token=BOS,
    traits=FamilyTraits(
        reasoning=True,
        thinks_by_default=False,
        parallel_calls=True,
        text_with_calls=True,
        profile=ExpectedProfile("deepseek_v31", "think", None, "thinking", "string", True, False, True),
    ),
    native_output=_output,
)
