"""Anthropic Messages API adapter: wire JSON <-> neutral types of ``proxy.chat``. Pure, no I/O.

Public API (called by the server / session)::

    parse_messages_request(body, memo=None) -> ChatRequest    # POST /v1/messages
    parse_count_tokens_request(body, memo=None) -> ChatRequest  # POST /v1/messages/count_tokens
    count_tokens_response(n: int) -> dict
    build_message(outcome, *, model, message_id) -> dict      # non-streaming answer
    stream_events(outcome, *, model, message_id) -> Iterator[tuple[str, dict]]
    ping_event() -> tuple[str, dict]                          # keep-alive while generating
    error_event(err) -> tuple[str, dict]                      # error after the stream started
    sse(event, data) -> bytes                                 # b"event: X\\ndata: {...}\\n\\n"
    render_error(err) -> tuple[int, dict]                     # HTTP status + error body
    models_response(names) -> dict                            # GET /v1/models
    new_message_id() -> str ("msg_..."), new_tool_use_id() -> str ("toolu_...")

Request translation (every parse error is ``InvalidRequest`` (400) naming the field):

- ``system`` (string or text blocks) becomes the first neutral system message; messages with
  ``role: "system"`` inside ``messages`` (Claude Code sends them; not in the spec) become
  system messages at their position.
- Several text blocks of one message are joined with "\\n"; ``cache_control`` and
  ``citations`` are noted in ``ignored_fields``.
- A user message's ``tool_result`` blocks become neutral ``tool`` messages, in order, before a
  user message holding the rest of its text (none when there is no text). ``is_error: true``
  is kept as ``"is_error": True`` on the tool message; ``name`` is filled from the matching
  earlier ``tool_use``.
- Assistant ``thinking`` blocks become ``reasoning_content``; ``redacted_thinking`` is
  ignored (noted); ``tool_use`` becomes ``tool_calls`` with ``arguments`` as a dict.
- ``image`` and ``document`` blocks anywhere are rejected: the proxy serves text models.
  Block types it does not know are skipped and noted in ``ignored_fields``.
- Custom tools become OpenAI function specs (``description`` only when given); tools with a
  ``type`` other than ``custom`` (server tools such as ``web_search_20250305``) are skipped
  and noted. An empty tool list becomes ``None``.
- ``tool_choice`` is translated to the OpenAI form: auto -> "auto", any -> "required",
  none -> "none", tool -> ``{"type": "function", "function": {"name": ...}}``.
- ``thinking``: enabled / adaptive / between_tools -> True, disabled -> False, absent -> None.

Response rendering: blocks come in the order thinking, text, tool_use. A thinking block's
``signature`` is ``"sha256:" + hex digest of its text`` (clients echo it; nothing checks it).
Text is omitted when empty, and when it is whitespace only and tool calls follow (the API
itself rejects such blocks when they are sent back). ``stop_reason``: ``max_tokens`` on a
length finish, else ``tool_use`` when there are tool calls, else ``stop_sequence`` when
``outcome.stop_sequence`` is set, else ``end_turn`` (also for "abort"). Tool-use ids are
``ToolCall.id`` unchanged: mint them with ``new_tool_use_id()`` for Anthropic sessions.
The stream is derived from ``build_message`` so folding it yields the same message.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field

from proxy import jsonio
from proxy.chat import ChatRequest, Message, SamplingParams, ToolSpec, TurnOutcome, name_tool_results
from proxy.errors import BackendError, InvalidRequest, ProtocolError, ProxyError
from proxy.wire import (
    Converted,
    MessageMemo,
    ToolListParser,
    WireModel,
    convert_messages,
    generic,
    note_unused,
    pieces,
    validate,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Wire models (see proxy.wire for the strictness rules). Unknown fields are reported as ignored.


class TextBlock(WireModel):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = None


class ThinkingBlock(WireModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # required by the spec; tolerated when missing


class RedactedThinkingBlock(WireModel):
    type: Literal["redacted_thinking"]
    data: str | None = None  # required by the spec; the proxy never reads it


class ToolUseBlock(WireModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class ToolResultBlock(WireModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None


class MessageParam(WireModel):
    role: Literal["user", "assistant", "system"]  # "system": not in the spec, sent by Claude Code
    content: str | list[dict[str, Any]]


class CustomTool(WireModel):
    name: str = Field(min_length=1)
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: dict[str, Any] | None = None


class ToolChoice(WireModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(WireModel):
    type: Literal["enabled", "disabled", "adaptive", "between_tools"]
    budget_tokens: int | None = None
    display: str | None = None


class CountTokensRequest(WireModel):
    model: str
    messages: list[Any] = Field(min_length=1)  # each entry is validated by _convert_message()
    system: str | list[TextBlock] | None = None
    tools: list[dict[str, Any]] | None = None  # each entry is validated by _tools()
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stream: bool | None = None
    stop_sequences: list[str] | None = None
    # Sampling fields of the older spec (SDK 2.14 no longer lists them); clients still send them.
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = None
    # In the spec, not acted on by the proxy (reported as ignored when sent):
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    output_config: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None  # beta
    container: Any = None
    cache_control: dict[str, Any] | None = None


_ACTED_ON = frozenset(
    {
        "model",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "thinking",
        "max_tokens",
        "stream",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
    }
)
_UNSUPPORTED = {"image": "images", "document": "documents"}

# ---------------------------------------------------------------------------------------------
# Requests


def parse_messages_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    """Translate a ``/v1/messages`` body. Raises ``InvalidRequest`` (400) on any bad input.
    With a session's ``memo``, messages it converted before are not validated again."""
    req = validate(MessagesRequest, body)
    sampling = SamplingParams(
        max_tokens=req.max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k is None else req.top_k,
        stop=tuple(req.stop_sequences or ()),
    )
    return _chat_request(req, sampling, stream=bool(req.stream), memo=memo)


def parse_count_tokens_request(body: Any, memo: MessageMemo | None = None) -> ChatRequest:
    """Translate a ``/v1/messages/count_tokens`` body (no ``max_tokens``; sampling defaults)."""
    return _chat_request(validate(CountTokensRequest, body), SamplingParams(), stream=False, memo=memo)


def count_tokens_response(n: int) -> dict[str, Any]:
    return {"input_tokens": n}


def _chat_request(
    req: CountTokensRequest, sampling: SamplingParams, stream: bool, memo: MessageMemo | None
) -> ChatRequest:
    ignored: set[str] = {k for k in req.model_fields_set if k not in _ACTED_ON}
    ignored |= set(req.model_extra or ())
    messages: list[Message] = []
    if req.system is not None:
        messages.append({"role": "system", "content": _text_of(req.system, "system", ignored)})
    messages = name_tool_results(messages + convert_messages(req.messages, _convert_message, memo, ignored))
    thinking = None if req.thinking is None else req.thinking.type != "disabled"
    if req.thinking is not None:
        ignored |= {f"thinking.{k}" for k in req.thinking.model_fields_set - {"type"}}
    return ChatRequest(
        protocol="anthropic",
        messages=messages,
        tools=_tools(req.tools, ignored),
        tool_choice=_tool_choice(req.tool_choice, ignored),
        sampling=sampling,
        stream=stream,
        model=req.model,
        thinking=thinking,
        ignored_fields=tuple(sorted(ignored)),
    )


def _convert_message(raw: Any, path: str) -> Converted:
    """One wire message -> (its chat messages, ignored-field notes); tool names are filled in
    afterwards over the whole history (``chat.name_tool_results``)."""
    ignored: set[str] = set()
    return tuple(_message(validate(MessageParam, raw, path), path, ignored)), frozenset(ignored)


def _message(m: MessageParam, path: str, ignored: set[str]) -> list[Message]:
    if m.role == "system":
        return [{"role": "system", "content": _text_of(m.content, f"{path}.content", ignored)}]
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    if m.role == "user":
        return _user_messages(m.content, path, ignored)
    return [_assistant_message(m.content, path, ignored)]


def _user_messages(content: list[Any], path: str, ignored: set[str]) -> list[Message]:
    """Tool results first (in order), then one user message with the text, if any."""
    texts: list[str] = []
    out: list[Message] = []
    for j, raw in enumerate(content):
        block = _block(raw, f"{path}.content[{j}]", ("text", "tool_result"), ignored)
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            out.append(_tool_message(block, f"{path}.content[{j}]", ignored))
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_message(content: list[Any], path: str, ignored: set[str]) -> Message:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    allowed = ("text", "thinking", "redacted_thinking", "tool_use")
    for j, raw in enumerate(content):
        block = _block(raw, f"{path}.content[{j}]", allowed, ignored)
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": block.input},
                }
            )
    msg: Message = {"role": "assistant", "content": "\n".join(texts)}
    if any(reasoning):
        msg["reasoning_content"] = "\n".join(reasoning)
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tool_message(block: ToolResultBlock, path: str, ignored: set[str]) -> Message:
    content = "" if block.content is None else _text_of(block.content, f"{path}.content", ignored)
    msg: Message = {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
    if block.is_error:
        msg["is_error"] = True
    return msg


def _text_of(content: str | list[Any], path: str, ignored: set[str]) -> str:
    """Join the text of ``content`` (a string or text blocks); other blocks are rejected."""
    if isinstance(content, str):
        return content
    parts = []
    for j, raw in enumerate(content):
        if isinstance(raw, TextBlock):  # already validated as part of the request model
            _note(raw, f"{path}[{j}]", ignored)
            block: WireModel | None = raw
        else:
            block = _block(raw, f"{path}[{j}]", ("text",), ignored)
        if isinstance(block, TextBlock):
            parts.append(block.text)
    return "\n".join(parts)


_BLOCKS: dict[str, type[WireModel]] = {
    "text": TextBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
}


def _block(raw: Any, path: str, allowed: tuple[str, ...], ignored: set[str]) -> WireModel | None:
    """Validate one content block. None for a block the proxy skips (noted in ``ignored``)."""
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{path}: expected a content block object", param=path)
    kind = raw.get("type")
    if not isinstance(kind, str):
        raise InvalidRequest(f"{path}.type: required string", param=f"{path}.type")
    if kind in _UNSUPPORTED:
        raise InvalidRequest(
            f"{_UNSUPPORTED[kind]} are not supported by this proxy ({path} has type {kind!r})", param=path
        )
    if kind not in _BLOCKS:
        ignored.add(f"{generic(path)}.type={kind}")
        return None
    if kind not in allowed:
        raise InvalidRequest(
            f"{path}: a {kind} block is not allowed here (allowed: {', '.join(allowed)})", param=path
        )
    block = validate(_BLOCKS[kind], raw, path)
    if isinstance(block, RedactedThinkingBlock):
        ignored.add(f"{generic(path)}.type=redacted_thinking")
        return None
    _note(block, path, ignored)
    return block


def _note(block: WireModel, path: str, ignored: set[str]) -> None:
    note_unused(block, path, {"cache_control", "citations"}, ignored)


def _validate_tools(raw: list[dict[str, Any]]) -> tuple[tuple[ToolSpec, ...], frozenset[str]]:
    """(tool specs, ignored-field notes) of a request's ``tools``; raises ``InvalidRequest``."""
    specs: list[ToolSpec] = []
    ignored: set[str] = set()
    for i, t in enumerate(raw):
        kind = t.get("type")
        if kind is not None and kind != "custom":
            log.info(
                "skipping server tool %r (type %r): the proxy serves client tools only", t.get("name"), kind
            )
            ignored.add(f"tools[].type={kind}")
            continue
        tool = validate(CustomTool, t, f"tools[{i}]")
        _note(tool, f"tools[{i}]", ignored)
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = tool.input_schema
        specs.append({"type": "function", "function": function})
    return tuple(specs), frozenset(ignored)


_tools = ToolListParser(_validate_tools)


def _tool_choice(choice: ToolChoice | None, ignored: set[str]) -> Any:
    if choice is None:
        return None
    if choice.disable_parallel_tool_use is not None:
        ignored.add("tool_choice.disable_parallel_tool_use")
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequest(
                "tool_choice.name: required when tool_choice.type is 'tool'", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


# ---------------------------------------------------------------------------------------------
# Responses


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def new_tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def build_message(outcome: TurnOutcome, *, model: str, message_id: str) -> dict[str, Any]:
    """The non-streaming ``Message`` for ``outcome``."""
    stop_reason = _stop_reason(outcome)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content_blocks(outcome),
        "stop_reason": stop_reason,
        "stop_sequence": outcome.stop_sequence if stop_reason == "stop_sequence" else None,
        "usage": _usage(outcome),
    }


def _content_blocks(outcome: TurnOutcome) -> list[dict[str, Any]]:
    parsed = outcome.parsed
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning:
        digest = hashlib.sha256(parsed.reasoning.encode()).hexdigest()
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": f"sha256:{digest}"})
    if parsed.content.strip() or (parsed.content and not parsed.tool_calls):
        blocks.append({"type": "text", "text": parsed.content})
    for tc in parsed.tool_calls:
        blocks.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": tc.arguments})
    return blocks


def _stop_reason(outcome: TurnOutcome) -> str:
    if outcome.finish_reason == "length":
        return "max_tokens"
    if outcome.parsed.tool_calls:
        return "tool_use"
    if outcome.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def _usage(outcome: TurnOutcome) -> dict[str, int]:
    return {
        "input_tokens": outcome.prompt_tokens,
        "output_tokens": outcome.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def stream_events(
    outcome: TurnOutcome, *, model: str, message_id: str, chunk_chars: int = 256
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The SSE events (name, data) of a streamed answer, split into deltas of ``chunk_chars``.

    Tool input JSON is always split into up to four ``input_json_delta`` pieces, so clients
    exercise their partial-JSON accumulation as with the real API.
    """
    message = build_message(outcome, model=model, message_id=message_id)
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**message["usage"], "output_tokens": 0}
    yield "message_start", {"type": "message_start", "message": start}
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        first: dict[str, Any]
        if kind == "thinking":
            first = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"], chunk_chars)
            ]
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
        elif kind == "text":
            first = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"], chunk_chars)]
        else:
            first = {**block, "input": {}}
            args = json.dumps(block["input"], ensure_ascii=False)
            deltas = [
                {"type": "input_json_delta", "partial_json": p} for p in pieces(args, -(-len(args) // 4))
            ]
        yield "content_block_start", {"type": "content_block_start", "index": index, "content_block": first}
        for delta in deltas:
            yield "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        yield "content_block_stop", {"type": "content_block_stop", "index": index}
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]}
    yield "message_delta", {"type": "message_delta", "delta": delta, "usage": message["usage"]}
    yield "message_stop", {"type": "message_stop"}


def ping_event() -> tuple[str, dict[str, Any]]:
    return "ping", {"type": "ping"}


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + jsonio.dumps(data) + b"\n\n"


def models_response(names: list[str]) -> dict[str, Any]:
    data = [
        {"type": "model", "id": n, "display_name": n, "created_at": "1970-01-01T00:00:00Z"} for n in names
    ]
    return {
        "data": data,
        "has_more": False,
        "first_id": names[0] if names else None,
        "last_id": names[-1] if names else None,
    }


# ---------------------------------------------------------------------------------------------
# Errors

_TYPE_NAMES = {
    "invalid_request": "invalid_request_error",
    "context_exhausted": "invalid_request_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "turn_limit_reached": "invalid_request_error",
    "budget_spent": "invalid_request_error",
    "rate_limited": "rate_limit_error",
}


def render_error(err: BaseException) -> tuple[int, dict[str, Any]]:
    """HTTP status and body for ``err``. Errors outside ``ProxyError`` become 500 ``api_error``.

    Replica trouble other than an unexpected upstream status is 529 ``overloaded_error``, which
    Claude Code and the SDK retry with backoff.
    """
    status, body = _error(err)
    return status, {"type": "error", "error": body}


def error_event(err: BaseException) -> tuple[str, dict[str, Any]]:
    """The ``error`` SSE event for a failure after the stream has started."""
    return "error", render_error(err)[1]


def _error(err: BaseException) -> tuple[int, dict[str, str]]:
    if isinstance(err, ProtocolError):
        return err.status, {"type": _TYPE_NAMES[err.error_type], "message": err.message}
    if isinstance(err, BackendError):
        if err.status == 503:
            return 529, {"type": "overloaded_error", "message": err.message}
        return err.status, {"type": "api_error", "message": err.message}
    if isinstance(err, ProxyError):
        return err.status, {"type": "api_error", "message": err.message}
    return 500, {"type": "api_error", "message": f"internal proxy error: {type(err).__name__}: {err}"}
