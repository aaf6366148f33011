"""What every family fixture is made of (pure data; the builder is in ``_build``)."""

from __future__ import annotations

from dataclasses import dataclass, field

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

    @property
    def all_tokens(self) -> tuple[str, ...]:
        return self.control_tokens + self.markup_tokens
