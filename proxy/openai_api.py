"""OpenAI Chat Completions adapter: wire JSON <-> neutral types of ``proxy.chat``. Pure, no I/O.

Public API (called by the server / session)::

    parse_chat_request(body, memo=None) -> ChatRequest         # POST /v1/chat/completions
    build_chat_completion(outcome, *, model, completion_id, created) -> dict
    stream_chunks(outcome, *, model, completion_id, created, include_usage) -> Iterator[dict]
    sse_chunk(chunk) -> bytes                                  # b"data: {...}\\n\\n"
    SSE_DONE, SSE_KEEPALIVE                                    # b"data: [DONE]\\n\\n", b": keep-alive\\n\\n"
    sse_error(err) -> bytes                                    # error after the stream started
    render_error(err) -> tuple[int, dict]                      # HTTP status + {"error": {...}}
    models_response(names, max_model_len=None) -> dict        # GET /v1/models
    new_completion_id() -> str ("chatcmpl-..."), new_tool_call_id() -> str ("call_...")

Request translation (every parse error is ``InvalidRequest`` (400) naming the field):

- Roles ``system``, ``developer`` (-> system), ``user``, ``assistant``, ``tool``. Content is a
  string, a list of parts, or null (-> ""). Text parts are joined with "\\n"; ``image_url``,
  ``input_audio`` and ``file`` parts are rejected (the proxy serves text models); other part
  types (e.g. ``refusal``) are skipped and noted in ``ignored_fields``.
- Assistant ``tool_calls[].function.arguments`` is a JSON string in the spec and becomes a dict.
  "" means ``{}``. Anything that is not a JSON object is rejected (400): the proxy only ever
  emits object arguments, so such a history was not produced by it, and guessing would render
  a prompt the client did not mean. A dict is also accepted (not in the spec).
- Assistant ``reasoning_content`` (vLLM/DeepSeek) or ``reasoning`` (vLLM >= 0.11, OpenRouter)
  becomes ``reasoning_content``. Neither is in the OpenAI spec.
- ``tool`` messages need ``tool_call_id``; ``name`` is filled from the matching earlier call.
- ``tools`` of type ``function`` become neutral specs (``description``/``parameters`` only when
  given); other tool types are skipped and noted. ``tool_choice`` is passed through.
- ``n`` other than 1 is rejected. ``max_completion_tokens`` wins over the older ``max_tokens``.
  ``stop`` may be a string or a list. ``stream_options.include_usage`` -> ``stream_usage``.
- Thinking: ``chat_template_kwargs.enable_thinking`` (vLLM, not in the spec) when it is a bool,
  else ``reasoning_effort`` ("none" -> False, any other value -> True), else None.

Response rendering: ``message.content`` is null when it is empty and tool calls exist;
``reasoning_content`` appears only when there is reasoning; ``arguments`` are JSON strings.
``finish_reason``: ``length`` on a length finish, else ``tool_calls`` when there are tool calls,
else ``stop`` (also for "abort"). Tool-call ids are ``ToolCall.id`` unchanged. The stream is
derived from ``build_chat_completion`` so folding it yields the same message.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from proxy import jsonio
from proxy.chat import ChatRequest, Message, SamplingParams, ToolSpec, TurnOutcome, name_tool_results
from proxy.errors import BackendError, ContextExhausted, InvalidRequest, ProtocolError, ProxyError
from proxy.wire import (
    Converted,
    MessageMemo,
    ToolListParser,
    WireModel,
    convert_messages,
    join_text_parts,
    note_unused,
    pieces,
    validate,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Wire models (see proxy.wire for the strictness rules). Unknown fields are reported as ignored.


class FunctionCall(WireModel):
    name: str
    arguments: str | dict[str, Any]  # dict: not in the spec, tolerated


class ToolCallParam(WireModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(WireModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None  # not in the spec: vLLM / DeepSeek
    reasoning: str | None = None  # not in the spec: vLLM >= 0.11, OpenRouter


class FunctionDef(WireModel):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(WireModel):
    type: Literal["function"]
    function: FunctionDef


class StreamOptions(WireModel):
    include_usage: bool | None = None


class ChatCompletionRequest(WireModel):
    model: str
    messages: list[Any] = Field(min_length=1)  # each entry is validated by _convert_message()
    tools: list[dict[str, Any]] | None = None  # each entry is validated by _tools()
    tool_choice: str | dict[str, Any] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: int | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    reasoning_effort: str | None = None
    top_k: int | None = None  # not in the spec: vLLM extension
    chat_template_kwargs: dict[str, Any] | None = None  # not in the spec: vLLM extension


_ACTED_ON = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "stream",
        "stream_options",
        "n",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "reasoning_effort",
        "top_k",
        "chat_template_kwargs",
    }
)
_UNSUPPORTED_PARTS = {"image_url": "images", "input_audio": "audio", "file": "files"}

# ---------------------------------------------------------------------------------------------
# Requests


def parse_chat_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    """Translate a ``/v1/chat/completions`` body. Raises ``InvalidRequest`` (400) on any bad input.
    With a session's ``memo``, messages it converted before are not validated again."""
    req = validate(ChatCompletionRequest, body)
    if req.n is not None and req.n != 1:
        raise InvalidRequest(
            f"n: must be 1 (this proxy generates one choice per request), got {req.n}", param="n"
        )
    ignored: set[str] = {k for k in req.model_fields_set if k not in _ACTED_ON} | set(req.model_extra or ())
    messages = name_tool_results(convert_messages(req.messages, _convert_message, memo, ignored))
    if req.stream_options is not None:
        note_unused(req.stream_options, "stream_options", set(), ignored)
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    return ChatRequest(
        protocol="openai",
        messages=messages,
        tools=_tools(req.tools, ignored),
        sampling=SamplingParams(
            max_tokens=req.max_completion_tokens or req.max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=-1 if req.top_k is None else req.top_k,
            stop=stop,
            seed=req.seed,
        ),
        stream=bool(req.stream),
        tool_choice=req.tool_choice,
        model=req.model,
        thinking=_thinking(req, ignored),
        stream_usage=bool(req.stream_options and req.stream_options.include_usage),
        ignored_fields=tuple(sorted(ignored)),
    )


def _convert_message(raw: Any, path: str) -> Converted:
    """One wire message -> (the chat message, ignored-field notes); tool names are filled in
    afterwards over the whole history (``chat.name_tool_results``)."""
    ignored: set[str] = set()
    return (_message(validate(ChatMessage, raw, path), path, ignored),), frozenset(ignored)


def _message(m: ChatMessage, path: str, ignored: set[str]) -> Message:
    note_unused(m, path, {"name", "refusal"} if m.role != "tool" else {"refusal"}, ignored)
    role = "system" if m.role == "developer" else m.role
    msg: Message = {"role": role, "content": _text_of(m.content, f"{path}.content", ignored)}
    if m.role == "tool":
        if m.tool_call_id is None:
            raise InvalidRequest(
                f"{path}.tool_call_id: required for role 'tool'", param=f"{path}.tool_call_id"
            )
        msg["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            msg["name"] = m.name  # the matching tool call's name wins (name_tool_results)
    elif m.role == "assistant":
        reasoning = m.reasoning_content if m.reasoning_content is not None else m.reasoning
        if reasoning:
            msg["reasoning_content"] = reasoning
        calls = [_tool_call(tc, f"{path}.tool_calls[{j}]") for j, tc in enumerate(m.tool_calls or ())]
        if calls:
            msg["tool_calls"] = calls
    else:
        for field in ("tool_calls", "tool_call_id", "reasoning_content", "reasoning"):
            if field in m.model_fields_set:
                ignored.add(f"messages[].{field}")
    return msg


def _tool_call(tc: ToolCallParam, path: str) -> dict[str, Any]:
    args: Any = tc.function.arguments
    if isinstance(args, str):
        try:
            args = jsonio.loads_shallow(args) if args.strip() else {}
        except ValueError as e:
            raise InvalidRequest(
                f"{path}.function.arguments: not valid JSON ({e})", param=f"{path}.function.arguments"
            ) from None
    if not isinstance(args, dict):
        raise InvalidRequest(
            f"{path}.function.arguments: must encode a JSON object", param=f"{path}.function.arguments"
        )
    return {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": args}}


def _text_of(content: str | list[dict[str, Any]] | None, path: str, ignored: set[str]) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return join_text_parts(content, path, ignored, text_kinds=("text",), unsupported=_UNSUPPORTED_PARTS)


def _validate_tools(raw: list[dict[str, Any]]) -> tuple[tuple[ToolSpec, ...], frozenset[str]]:
    """(tool specs, ignored-field notes) of a request's ``tools``; raises ``InvalidRequest``."""
    specs: list[ToolSpec] = []
    ignored: set[str] = set()
    for i, t in enumerate(raw):
        if t.get("type") != "function":
            log.info("skipping tool of type %r: the proxy serves function tools only", t.get("type"))
            ignored.add(f"tools[].type={t.get('type')}")
            continue
        tool = validate(FunctionTool, t, f"tools[{i}]")
        note_unused(tool.function, f"tools[{i}].function", {"strict"}, ignored)
        specs.append(function_spec(tool.function))
    return tuple(specs), frozenset(ignored)


def function_spec(fn: FunctionDef) -> ToolSpec:
    """The neutral tool spec of a function definition (``strict`` is not used: the proxy
    does no constrained decoding)."""
    function: dict[str, Any] = {"name": fn.name}
    if fn.description is not None:
        function["description"] = fn.description
    if fn.parameters is not None:
        function["parameters"] = fn.parameters
    return {"type": "function", "function": function}


_tools = ToolListParser(_validate_tools)


def _thinking(req: ChatCompletionRequest, ignored: set[str]) -> bool | None:
    kwargs = dict(req.chat_template_kwargs or {})
    enable = kwargs.pop("enable_thinking", None)
    ignored |= {f"chat_template_kwargs.{k}" for k in kwargs}
    if isinstance(enable, bool):
        return enable
    if enable is not None:
        ignored.add("chat_template_kwargs.enable_thinking")
    if req.reasoning_effort is not None:
        return req.reasoning_effort != "none"
    return None


# ---------------------------------------------------------------------------------------------
# Responses

SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEPALIVE = b": keep-alive\n\n"


def new_completion_id() -> str:
    return "chatcmpl-" + uuid.uuid4().hex


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def build_chat_completion(
    outcome: TurnOutcome, *, model: str, completion_id: str, created: int
) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object for ``outcome``."""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": _message_out(outcome),
                "finish_reason": _finish_reason(outcome),
                "logprobs": None,
            }
        ],
        "usage": _usage(outcome),
    }


def _message_out(outcome: TurnOutcome) -> dict[str, Any]:
    parsed = outcome.parsed
    content = None if (parsed.tool_calls and not parsed.content) else parsed.content
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if parsed.reasoning:
        msg["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        msg["tool_calls"] = [
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.name, "arguments": json.dumps(tc.arguments, ensure_ascii=False)},
            }
            for tc in parsed.tool_calls
        ]
    return msg


def _finish_reason(outcome: TurnOutcome) -> str:
    if outcome.finish_reason == "length":
        return "length"
    return "tool_calls" if outcome.parsed.tool_calls else "stop"


def _usage(outcome: TurnOutcome) -> dict[str, int]:
    total = outcome.prompt_tokens + outcome.completion_tokens
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": total,
    }


def stream_chunks(
    outcome: TurnOutcome,
    *,
    model: str,
    completion_id: str,
    created: int,
    include_usage: bool = False,
    chunk_chars: int = 256,
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed answer (without ``[DONE]``).

    Order: role, reasoning pieces, content pieces, per tool call a header (index, id, name)
    and its argument JSON in up to four pieces, the finish chunk, and with ``include_usage``
    a last chunk with empty ``choices`` and the usage (other chunks then carry ``usage: null``,
    as upstream does).
    """
    msg = _message_out(outcome)
    head = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
    if include_usage:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            **head,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    yield chunk({"role": "assistant"})
    for piece in pieces(msg.get("reasoning_content", ""), chunk_chars):
        yield chunk({"reasoning_content": piece})
    for piece in pieces(msg["content"] or "", chunk_chars):
        yield chunk({"content": piece})
    for index, call in enumerate(msg.get("tool_calls", ())):
        function = {"name": call["function"]["name"], "arguments": ""}
        yield chunk(
            {"tool_calls": [{"index": index, "id": call["id"], "type": "function", "function": function}]}
        )
        args = call["function"]["arguments"]
        for piece in pieces(args, -(-len(args) // 4)):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, _finish_reason(outcome))
    if include_usage:
        yield {**head, "choices": [], "usage": _usage(outcome)}


def sse_chunk(chunk: dict[str, Any]) -> bytes:
    return b"data: " + jsonio.dumps(chunk) + b"\n\n"


def models_response(names: list[str], max_model_len: int | None = None) -> dict[str, Any]:
    """``max_model_len`` (vLLM's own field in this listing): the session's context window,
    which OpenAI-speaking agents (terminus) read to size their context management."""
    extra = {} if max_model_len is None else {"max_model_len": max_model_len}
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": 0, "owned_by": "trialflow", **extra} for n in names],
    }


# ---------------------------------------------------------------------------------------------
# Errors


def render_error(err: BaseException) -> tuple[int, dict[str, Any]]:
    """HTTP status and ``{"error": {message, type, param, code}}`` for ``err``.

    Context exhaustion uses OpenAI's wording and code ``context_length_exceeded``, which
    OpenAI-compatible scaffolds match to trigger compaction. Errors outside ``ProxyError``
    become 500 ``server_error``.
    """
    status, message, kind, param, code = _error(err)
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code}}


def sse_error(err: BaseException) -> bytes:
    """The SSE event for a failure after the stream has started (upstream sends the error object)."""
    return sse_chunk(render_error(err)[1])


def _error(err: BaseException) -> tuple[int, str, str, str | None, str | None]:
    if isinstance(err, ContextExhausted):
        message = (
            f"This model's maximum context length is {err.max_context_tokens} tokens. However, your request has "
            f"{err.prompt_tokens} input tokens. Please reduce the length of the input messages."
        )
        return 400, message, "invalid_request_error", "messages", "context_length_exceeded"
    if isinstance(err, ProtocolError) and err.error_type == "rate_limited":
        return err.status, err.message, "requests", None, "rate_limit_exceeded"  # OpenAI's 429 shape
    if isinstance(err, ProtocolError):
        kind = "not_found_error" if err.error_type == "not_found" else "invalid_request_error"
        code = None if err.error_type == "invalid_request" else err.error_type
        return err.status, err.message, kind, err.param, code
    if isinstance(err, BackendError):
        return err.status, err.message, "server_error", None, type(err).__name__
    if isinstance(err, ProxyError):
        return err.status, err.message, "server_error", None, None
    return 500, f"internal proxy error: {type(err).__name__}: {err}", "server_error", None, None
