"""What every family fixture is made of (pure data; the builder is in ``_build``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from proxy.chat import ParsedOutput

# ``text(content)``: content as a string, None or a list of text parts (the tiny model's macro).
from trialflow.tinymodel import HERMES_TOOLS_MACRO, TEXT_MACRO

# An assistant message's ``content`` and ``reasoning``: ``reasoning_content`` when it is a
# string, else a ``<think>...</think>`` prefix split off the content (Qwen3 and GLM-4.5 alike).
# A template fragment for inside the messages loop (``m``), not a macro: it sets two variables.
SPLIT_REASONING = r"""
        {%- set content = text(m.content) -%}
        {%- set reasoning = '' -%}
        {%- if m.reasoning_content is string -%}
            {%- set reasoning = m.reasoning_content -%}
        {%- elif '</think>' in content -%}
            {%- set reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') -%}
            {%- set content = content.split('</think>')[-1].lstrip('\n') -%}
        {%- endif -%}
""".strip("\n")

__all__ = [
    "HERMES_TOOLS_MACRO",
    "SPLIT_REASONING",
    "TEXT_MACRO",
    "ExpectedProfile",
    "FamilyFixture",
    "FamilyTraits",
    "NativeOutput",
]


class ExpectedProfile(NamedTuple):
    """What ``proxy.profiles.detect_profile`` must find by probing the family's template
    (the ``ModelProfile`` fields of the same names)."""

    tool_parser: str | None
    reasoning_parser: str | None
    reasoning_field: str | None
    thinking_switch: str | None
    arguments: str  # "object" or "string": how the template wants a call's arguments
    parallel_tool_calls: bool
    stop_opens_next: bool
    call_with_content_and_reasoning: bool


@dataclass(frozen=True)
class FamilyTraits:
    """What a family's model does, as its model card and serving docs describe it.

    Every family test reads these instead of keeping its own set of names, so a new family
    is covered everywhere once its fixture states them (nothing is skipped by a missed set).
    """

    reasoning: bool  # the model writes reasoning at all (a think block or an analysis channel)
    thinks_by_default: bool  # ... without being asked (DeepSeek-V3.1 only in thinking mode)
    parallel_calls: bool  # more than one tool call in one turn
    text_with_calls: bool  # visible text and a tool call in the same turn
    profile: ExpectedProfile


# ``native(parsed, thinking=...) -> (text, stop token)``: what the family's model generates after
# its generation prompt for the reply ``parsed``, and the token that ends it. These are the
# model's own output formats, which for several families differ from how the template renders
# the same message in the history (gpt-oss header order and ``<|return|>``, Qwen3's empty think
# block, DeepSeek's dropped reasoning).
NativeOutput = Callable[..., tuple[str, str]]


@dataclass(frozen=True)
class FamilyFixture:
    """A model family as its tokenizer files describe it, on the tiny BPE.

    ``control_tokens`` are special (``skip_special_tokens=True`` drops them when decoding);
    ``markup_tokens`` are single ids that a plain decode keeps. ``eos_token`` is the
    tokenizer's ``eos_token``; ``generation_eos`` the ``eos_token_id`` list of the family's
    ``generation_config.json`` (what vLLM stops on), as token texts. ``template_kwargs`` are
    extra render variables a family's serving uses (e.g. Llama's ``builtin_tools``), empty
    for the default rendering. The rendering rules are in each family module's docstring.
    """

    name: str
    chat_template: str
    control_tokens: tuple[str, ...]
    markup_tokens: tuple[str, ...]
    eos_token: str
    generation_eos: tuple[str, ...]
    pad_token: str
    bos_token: str | None = None
    template_kwargs: dict = field(default_factory=dict)
    traits: FamilyTraits = field(kw_only=True)
    native_output: NativeOutput = field(kw_only=True, repr=False)

    def native(self, parsed: ParsedOutput, *, thinking: bool = True) -> tuple[str, str]:
        """The family's own output for ``parsed`` (``NativeOutput``)."""
        return self.native_output(parsed, thinking=thinking)

    @property
    def all_tokens(self) -> tuple[str, ...]:
        return self.control_tokens + self.markup_tokens
