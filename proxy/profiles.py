"""Model family profiles: what the proxy must know about a model beyond its chat template (pure).

Public API:

    ModelProfile                    frozen; .with_overrides(mapping) -> ModelProfile (ValueError/TypeError)
    detect_profile(tokenizer, *, generation_eos=None, overrides=None) -> ModelProfile
    load_generation_eos(model_dir) -> list[int] | None      generation_config.json's eos_token_id list
    UnsupportedTemplate(ValueError)  a template the proxy cannot serve (raised at start-up)

A profile is detected from the model directory at load, by rendering *sentinel conversations*
(short made-up messages with unique marker texts) with the model's own template and looking
where the markers land. Nothing is matched against a list of known template texts:

- ``stop_tokens``: the turn terminators, i.e. ``generation_config.json``'s ``eos_token_id``
  list plus the tokenizer's ``eos_token`` (e.g. ``<|call|>`` for gpt-oss, ``<|eom_id|>`` for
  Llama-3.1, ``<|user|>``/``<|observation|>`` for GLM).
- ``closers``: ``stop_tokens`` plus the special token that the template renders right after an
  assistant message's text when another message follows (gpt-oss renders ``<|end|>`` there
  while the model itself stops on ``<|return|>``). The tracker locates the end of the model's
  last turn as the first closer after that turn's sentinels (see proxy.tokenization).
- ``stop_opens_next``: the template renders no closer at the end of a conversation that ends
  with an assistant message; the closer belongs to the next message (GLM: the model's stop
  token ``<|observation|>`` is the first token of the rendered tool result).
- ``reasoning_field``: the message key the template reads reasoning from (``reasoning_content``,
  ``thinking``), None when no probe's reasoning is rendered (the template drops it everywhere,
  e.g. DeepSeek-V3.1, or has none).
- ``thinking_switch``: the render variable that turns thinking on/off: ``enable_thinking``,
  ``thinking`` (bools) or ``reasoning_effort`` (False -> "low", True -> the template default).
- ``arguments``: ``"object"`` when the template renders tool-call arguments given as a mapping,
  ``"string"`` when only a JSON string renders (DeepSeek-V3.1 concatenates them), None when
  no tool call renders at all.
- ``parallel_tool_calls``: False when two calls in one message raise (Llama-3.1, gpt-oss).
- ``call_with_content_and_reasoning``: False when an assistant message with a tool call that
  carries both content and reasoning raises (gpt-oss: "Cannot pass both content and thinking
  in an assistant message with tool calls!"; its template has one analysis slot before a
  call). gpt-oss writes exactly that turn when it says what it will do first: analysis, a
  ``commentary`` preamble (returned as content), then the call. ``adapt`` then renders the
  message with its reasoning and its content joined by a newline as the reasoning (the one
  slot, which the template renders as analysis as it renders either field alone). Only the
  environment after the model's turn is taken from a render (proxy.tokenization rule 3), so a
  conversation extending the model's turn keeps its own tokens (analysis, preamble, call)
  exactly; the joined text is what a fresh render of that history (a new segment) shows.
- ``family``, ``tool_parser``, ``reasoning_parser``: named after the tool-call markup seen in
  the render (``hermes``, ``qwen3_coder``, ``glm45``, ``deepseek_v31``, ``harmony``,
  ``llama3_json``; family ``custom`` and no tool parser when none is recognised) and after
  ``<think>`` appearing in a reasoning render (``think``; ``harmony`` for gpt-oss).
- ``header_boundary``: the first added token after the system text (for proxy.prefix_cache).

Every field can be overridden: ``overrides`` (settings ``TRIALFLOW_MODEL_PROFILE``, JSON) at
load, and a session's ``profile`` object at ``POST /sessions``. A template that cannot render a
plain user turn, or renders no special token after an assistant message's text, raises
``UnsupportedTemplate`` at start-up with the reason: the proxy cannot locate turns in it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from proxy.chat import Message

Arguments = Literal["object", "string"]
_SWITCHES = ("enable_thinking", "thinking", "reasoning_effort")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")

# Sentinel texts: plain ASCII letters and digits, so every template filter (trim, tojson,
# strip, split on tags) leaves them intact and no template text contains them.
_U, _U2, _C, _R, _A, _T, _S = (
    f"tfprobe{x}Q" for x in ("user", "usertwo", "content", "reason", "arg", "tool", "sys")
)
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "tfprobe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {"tfarg": {"type": "string"}}, "required": ["tfarg"]},
    },
}

# tool-call markup -> (family, tool parser, reasoning parser if the family has its own)
_TOOL_FORMATS: tuple[tuple[str, str, str, str | None], ...] = (
    ("to=functions.", "gpt_oss", "harmony", "harmony"),
    ("<arg_key>", "glm45", "glm45", None),
    ("<｜tool▁calls▁begin｜>", "deepseek_v31", "deepseek_v31", None),
    ("<function=", "qwen3_coder", "qwen3_coder", None),
    ("<tool_call>", "hermes", "hermes", None),
    ('"parameters"', "llama3", "llama3_json", None),
)


class UnsupportedTemplate(ValueError):
    """The model's chat template cannot be served by the proxy (the message says why)."""


@dataclass(frozen=True)
class ModelProfile:
    family: str = "custom"
    stop_tokens: tuple[str, ...] = ()
    closers: tuple[str, ...] = ()
    stop_opens_next: bool = False
    reasoning_field: str | None = "reasoning_content"
    thinking_switch: str | None = "enable_thinking"
    arguments: Arguments | None = "object"
    parallel_tool_calls: bool = True
    call_with_content_and_reasoning: bool = True
    reasoning_parser: str | None = "think"
    tool_parser: str | None = "hermes"
    header_boundary: str = ""

    def with_overrides(self, body: Mapping[str, Any] | None) -> ModelProfile:
        """This profile with ``body``'s fields replaced. ``ValueError``/``TypeError`` for unknown
        fields or wrong types (a session body answers 400, settings fail at start-up)."""
        if not body:
            return self
        if not isinstance(body, Mapping):
            raise TypeError("profile must be a JSON object")
        known = {f.name for f in fields(self)}
        if set(body) - known:
            raise ValueError(f"unknown profile fields: {sorted(set(body) - known)}; known: {sorted(known)}")
        out: dict[str, Any] = {}
        for k, v in body.items():
            if k in ("stop_tokens", "closers"):
                if not isinstance(v, list) or not all(isinstance(t, str) and t for t in v):
                    raise TypeError(f"profile.{k} must be a list of token texts")
                out[k] = tuple(v)
            elif k in ("stop_opens_next", "parallel_tool_calls", "call_with_content_and_reasoning"):
                if not isinstance(v, bool):
                    raise TypeError(f"profile.{k} must be a boolean")
                out[k] = v
            elif k == "arguments":
                if v not in ("object", "string", None):
                    raise ValueError("profile.arguments must be 'object', 'string' or null")
                out[k] = v
            elif k == "thinking_switch":
                if v not in (*_SWITCHES, None):
                    raise ValueError(f"profile.thinking_switch must be one of {list(_SWITCHES)} or null")
                out[k] = v
            else:
                if (
                    v is not None
                    and not isinstance(v, str)
                    or (k in ("family", "header_boundary") and v is None)
                ):
                    raise TypeError(f"profile.{k} must be a string")
                out[k] = v
        new = replace(self, **out)
        if "stop_tokens" in out and "closers" not in out:
            new = replace(new, closers=tuple(dict.fromkeys((*new.stop_tokens, *self.closers))))
        return new

    # ------------------------------------------------------------------ rendering

    def thinking_kwargs(self, thinking: bool | None) -> dict[str, Any]:
        """Render variables for a request's thinking switch (None: the template's default)."""
        if thinking is None or self.thinking_switch is None:
            return {}
        if self.thinking_switch == "reasoning_effort":
            return {} if thinking else {"reasoning_effort": "low"}
        return {self.thinking_switch: thinking}

    def adapt(self, messages: Sequence[Message]) -> list[Message]:
        """Neutral messages as this family's template reads them: reasoning under
        ``reasoning_field``; tool-call arguments as a JSON string where the template
        concatenates them, and as an object where it iterates them (a caller that passes the
        JSON text of an object gets the object: ``|items`` on a string raises). Messages that
        need no change are passed through (not copied). A tool-call message with content and
        reasoning, where the template refuses both (``call_with_content_and_reasoning``), gets
        them joined as its reasoning (module docstring)."""
        rename = self.reasoning_field not in (None, "reasoning_content")
        out = []
        for m in messages:
            if not self.call_with_content_and_reasoning:
                m = _one_text_before_call(m)
            if rename and "reasoning_content" in m:
                reasoning = m["reasoning_content"]
                m = {k: v for k, v in m.items() if k != "reasoning_content"}
                m[self.reasoning_field] = reasoning  # type: ignore[index]
            calls = m.get("tool_calls")
            if calls and self.arguments is not None:
                fixed = [_args_as(tc, self.arguments) for tc in calls]
                if any(a is not b for a, b in zip(fixed, calls, strict=True)):
                    m = {**m, "tool_calls": fixed}
            out.append(m)
        return out


def _one_text_before_call(m: Message) -> Message:
    """``m`` with its content joined after its reasoning, as its reasoning, when it is an
    assistant message with tool calls and both texts are non-empty (as the template tests them:
    whitespace counts); else ``m`` itself."""
    reasoning, content = m.get("reasoning_content"), m.get("content")
    if m.get("role") != "assistant" or not m.get("tool_calls") or not reasoning or not content:
        return m
    if not isinstance(content, str):  # text parts: the text the template would join
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
        if not content:
            return m
    return {**m, "content": "", "reasoning_content": f"{reasoning}\n{content}"}


def _args_as(tc: Any, kind: Arguments) -> Any:
    """``tc`` with its arguments as ``kind``; ``tc`` itself when they already are (or a string
    is not the JSON text of an object)."""
    f = tc.get("function", tc)
    args = f.get("arguments")
    if kind == "string":
        if isinstance(args, str):
            return tc
        new: Any = json.dumps(args, ensure_ascii=False)
    else:
        if not isinstance(args, str):
            return tc
        try:
            new = json.loads(args)
        except (ValueError, RecursionError):
            return tc
        if not isinstance(new, dict):
            return tc
    return {**tc, "function": {**f, "arguments": new}} if "function" in tc else {**tc, "arguments": new}


def load_generation_eos(model_dir: Path | str | None) -> list[int] | None:
    """``eos_token_id`` of ``model_dir/generation_config.json`` as a list, or None without one."""
    if model_dir is None:
        return None
    path = Path(model_dir) / "generation_config.json"
    try:
        body = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise UnsupportedTemplate(f"{path} cannot be read: {exc}") from exc
    eos = body.get("eos_token_id")
    if eos is None:
        return None
    ids = eos if isinstance(eos, list) else [eos]
    if not all(isinstance(i, int) for i in ids):
        raise UnsupportedTemplate(f"{path}: eos_token_id must be an int or a list of ints, got {eos!r}")
    return ids


# ---------------------------------------------------------------------- detection


def _special_texts(tokenizer: Any) -> set[str]:
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    for tok in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(tok, "special", False):
            special.add(tok.content)
    return special


def _added_texts(tokenizer: Any) -> set[str]:
    return {t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values()} | _special_texts(
        tokenizer
    )


def _first_of(text: str, tokens: set[str] | Sequence[str], start: int, end: int | None = None) -> str | None:
    """The token of ``tokens`` that occurs first in ``text[start:end]`` (longest on a tie)."""
    best: tuple[int, int, str] | None = None
    for t in tokens:
        i = text.find(t, start, len(text) if end is None else end)
        if i >= 0 and (best is None or (i, -len(t)) < (best[0], best[1])):
            best = (i, -len(t), t)
    return None if best is None else best[2]


def _call(args: Any) -> dict:
    return {"id": "call_tfprobe", "type": "function", "function": {"name": "tfprobe_tool", "arguments": args}}


def detect_profile(
    tokenizer: Any,
    *,
    generation_eos: Sequence[int] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> ModelProfile:
    """Probe ``tokenizer``'s chat template (module docstring). Raises ``UnsupportedTemplate``."""

    def render(
        messages: list[dict],
        *,
        gen: bool = False,
        tools: list | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        return tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=gen, **(template_kwargs or {})
        )

    if getattr(tokenizer, "chat_template", None) is None:
        raise UnsupportedTemplate("the tokenizer has no chat template")
    user = {"role": "user", "content": _U}
    try:
        base = render([user], gen=True)
        plain = render([user, {"role": "assistant", "content": _C}, {"role": "user", "content": _U2}])
        last = render([user, {"role": "assistant", "content": _C}])
    except Exception as exc:  # noqa: BLE001 - any template failure here makes the model unservable
        raise UnsupportedTemplate(f"the chat template cannot render a plain conversation: {exc}") from exc
    if _U not in base or _C not in plain or _U2 not in plain:
        raise UnsupportedTemplate("the chat template does not render message texts")
    special = _special_texts(tokenizer)
    eos = tokenizer.eos_token
    stops = [eos] if eos else []
    for i in generation_eos or ():
        t = tokenizer.convert_ids_to_tokens(i)
        if t is not None and t not in stops:
            stops.append(t)
    if not stops:
        raise UnsupportedTemplate(
            "no end-of-turn token: the tokenizer has no eos_token and no generation_config"
        )
    c_end = plain.find(_C) + len(_C)
    closer = _first_of(plain, special, c_end, plain.find(_U2, c_end))
    if closer is None:
        raise UnsupportedTemplate(
            "the chat template renders no special token between an assistant message and the next "
            "message, so the end of the model's turn cannot be located"
        )
    closers = tuple(dict.fromkeys((*stops, closer)))
    opens_next = _first_of(last, closers, last.find(_C) + len(_C)) is None

    reasoning_field = None
    reasoning_render = ""
    for key in _REASONING_FIELDS:
        try:
            out = render([user, {"role": "assistant", "content": _C, key: _R}])
        except Exception:  # noqa: BLE001 - a field the template rejects is not its field
            continue
        if _R in out:
            reasoning_field, reasoning_render = key, out
            break

    switch = None
    switch_renders = ""
    for key, on, off in (
        ("enable_thinking", True, False),
        ("thinking", True, False),
        ("reasoning_effort", "high", "low"),
    ):
        try:
            a = render([user], gen=True, template_kwargs={key: on})
            b = render([user], gen=True, template_kwargs={key: off})
        except Exception:  # noqa: BLE001
            continue
        if a != b:
            switch, switch_renders = key, a + b
            break

    arguments: Arguments | None = None
    tool_render = ""
    tool_msg = {"role": "tool", "tool_call_id": "call_tfprobe", "content": _T}
    modes: tuple[tuple[Arguments, object], ...] = (
        ("object", {"tfarg": _A}),
        ("string", json.dumps({"tfarg": _A})),
    )
    for mode, args in modes:
        msgs: list[dict] = [user, {"role": "assistant", "content": "", "tool_calls": [_call(args)]}, tool_msg]
        try:
            out = render(msgs, gen=True, tools=[_PROBE_TOOL])
        except Exception:  # noqa: BLE001
            continue
        if _A in out and _T in out:
            arguments, tool_render = mode, out
            break
    parallel = True
    if arguments is not None:
        a_end = tool_render.rfind(_A) + len(_A)
        if _first_of(tool_render, closers, a_end, tool_render.find(_T, a_end)) is None:
            raise UnsupportedTemplate(
                "the chat template renders no end-of-turn token after a tool call, so the end of the "
                "model's tool-call turn cannot be located"
            )
        args = {"tfarg": _A} if arguments == "object" else json.dumps({"tfarg": _A})
        two: list[dict] = [
            user,
            {"role": "assistant", "content": "", "tool_calls": [_call(args), _call(args)]},
            tool_msg,
        ]
        try:
            render(two, tools=[_PROBE_TOOL])
        except Exception:  # noqa: BLE001 - the template refuses parallel calls
            parallel = False
    both = True
    if arguments is not None and reasoning_field is not None:
        args = {"tfarg": _A} if arguments == "object" else json.dumps({"tfarg": _A})
        said: list[dict] = [
            user,
            {"role": "assistant", "content": _C, reasoning_field: _R, "tool_calls": [_call(args)]},
            tool_msg,
        ]
        try:
            render(said, gen=True, tools=[_PROBE_TOOL])
        except Exception:  # noqa: BLE001 - the template refuses content and reasoning on a call
            both = False

    family, tool_parser, reasoning_parser = "custom", None, None
    for marker, fam, tparser, rparser in _TOOL_FORMATS:
        if marker in tool_render:
            family, tool_parser, reasoning_parser = fam, tparser, rparser
            break
    if reasoning_parser is None and "<think>" in reasoning_render + switch_renders:
        reasoning_parser = "think"

    sys_render = render([{"role": "system", "content": _S}, user], gen=True)
    boundary = _first_of(sys_render, _added_texts(tokenizer), sys_render.find(_S) + len(_S)) or eos or ""
    profile = ModelProfile(
        family=family,
        stop_tokens=tuple(stops),
        closers=closers,
        stop_opens_next=opens_next,
        reasoning_field=reasoning_field,
        thinking_switch=switch,
        arguments=arguments,
        parallel_tool_calls=parallel,
        call_with_content_and_reasoning=both,
        reasoning_parser=reasoning_parser,
        tool_parser=tool_parser,
        header_boundary=boundary,
    )
    return profile.with_overrides(overrides)
