"""proxy.openai_api against the official ``openai`` SDK: its request serialisation, its
response types, its SSE stream reader and chunk accumulator (``ChatCompletionStreamState``),
run in-process over an httpx2 MockTransport that answers with the bytes this module produces."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the SDKs use httpx2 (an httpx fork) for their transports
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from proxy import openai_api as api
from proxy.chat import ParsedOutput, ToolCall, TurnOutcome, assistant_message
from proxy.errors import (
    BackendHTTPError,
    ContextExhausted,
    InvalidRequest,
    NotFound,
    ProtocolError,
    ReplicaUnreachable,
)
from tests._hypothesis import examples
from tests.proxy._strategies import json_values, mostly, short

FIXTURES = Path(__file__).parent / "fixtures"


def opencode_body() -> dict[str, Any]:
    return json.loads((FIXTURES / "opencode_chat.json").read_text())


def minimal(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def outcome(content="", reasoning=None, calls=(), finish="stop") -> TurnOutcome:
    parsed = ParsedOutput(content=content, reasoning=reasoning, tool_calls=list(calls))
    return TurnOutcome(parsed, finish, prompt_tokens=200, completion_tokens=31)


def sdk_client(handler, **kw: Any) -> openai.OpenAI:
    transport = httpx.MockTransport(handler)
    return openai.OpenAI(
        api_key="x", base_url="http://proxy/v1", http_client=httpx.Client(transport=transport), **kw
    )


# ------------------------------------------------------------------------------ requests


def test_opencode_request_translates_to_neutral_messages():
    req = api.parse_chat_request(opencode_body())

    assert (
        req.protocol == "openai" and req.model == "tiny" and req.stream is True and req.stream_usage is True
    )
    assert (req.sampling.max_tokens, req.sampling.temperature, req.sampling.top_p) == (4096, 0.6, 0.95)
    assert req.tool_choice == "auto" and req.thinking is None
    assert [m["role"] for m in req.messages] == [
        "system",
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "tool",
    ]
    assert req.messages[2] == {"role": "user", "content": "Fix add() in math_utils.py so the tests pass."}
    assert req.messages[3] == {
        "role": "assistant",
        "content": "I'll read the file.",
        "reasoning_content": "Start by reading the source.",
        "tool_calls": [{"id": "call_9a8b7c6d5e4f3a2b1c0d9e8f", "type": "function",
                        "function": {"name": "read", "arguments": {"filePath": "/app/math_utils.py"}}}],
    }  # fmt: skip
    assert (
        req.messages[4]["name"] == "read"
        and req.messages[4]["tool_call_id"] == "call_9a8b7c6d5e4f3a2b1c0d9e8f"
    )
    second = req.messages[5]
    assert second["content"] == "" and "reasoning_content" not in second
    assert [c["function"]["arguments"] for c in second["tool_calls"]] == [
        {"filePath": "/app/math_utils.py", "oldString": "return a - b", "newString": "return a + b"},
        {"command": "pytest -q", "description": "Run tests"},
    ]
    assert req.messages[7] == {"role": "tool", "tool_call_id": "call_3c4d5e6f7a8b9c0d1e2f3a4b", "name": "bash",
                               "content": "1 passed in 0.01s"}  # fmt: skip
    assert [t["function"]["name"] for t in req.tools] == [
        "bash", "edit", "glob", "grep", "list", "read", "write", "todowrite", "task",
    ]  # fmt: skip
    assert req.tools[0]["function"]["parameters"]["required"] == ["command", "description"]
    assert req.ignored_fields == ("tools[].function.strict",)


def test_roles_and_content_forms():
    req = api.parse_chat_request(minimal(messages=[
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": "q", "name": "alice"},
        {"role": "assistant", "content": [{"type": "text", "text": "x"}, {"type": "refusal", "refusal": "no"}], "reasoning": "r"},
    ]))  # fmt: skip
    assert req.messages == [
        {"role": "system", "content": "a\nb"}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "x", "reasoning_content": "r"},
    ]  # fmt: skip
    assert set(req.ignored_fields) == {"messages[].name", "messages[].content[].type=refusal"}


def test_sampling_fields():
    req = api.parse_chat_request(
        minimal(max_tokens=10, max_completion_tokens=20, stop="END", seed=7, top_k=5, temperature=0, n=1)
    )
    s = req.sampling
    assert (s.max_tokens, s.stop, s.seed, s.top_k, s.temperature) == (20, ("END",), 7, 5, 0)
    assert api.parse_chat_request(minimal(stop=["a", "b"], stream=None)).sampling.stop == ("a", "b")


@pytest.mark.parametrize(
    "extra, expected",
    [
        ({}, None),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "high"}, True),
        ({"chat_template_kwargs": {"enable_thinking": False}, "reasoning_effort": "high"}, False),
        ({"chat_template_kwargs": {"enable_thinking": True}}, True),
    ],
)
def test_thinking(extra, expected):
    assert api.parse_chat_request(minimal(**extra)).thinking is expected


def test_tool_arguments_forms():
    def args(raw: Any) -> Any:
        msg = {
            "role": "assistant",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": raw}}],
        }
        return api.parse_chat_request(minimal(messages=[msg])).messages[0]["tool_calls"][0]["function"][
            "arguments"
        ]

    assert args('{"a": [1, 2]}') == {"a": [1, 2]}
    assert args("") == {} and args("  ") == {}
    assert args({"a": 1}) == {"a": 1}
    with pytest.raises(
        InvalidRequest, match=r"messages\[0\]\.tool_calls\[0\]\.function\.arguments: not valid JSON"
    ):
        args('{"a": ')
    with pytest.raises(InvalidRequest, match="must encode a JSON object"):
        args("[1]")


def test_non_function_tools_are_skipped_and_reported():
    req = api.parse_chat_request(minimal(tools=[{"type": "custom", "custom": {"name": "x"}}]))
    assert req.tools is None and req.ignored_fields == ("tools[].type=custom",)


@pytest.mark.parametrize(
    "body, message",
    [
        ("hi", "request body: expected a JSON object, got string"),
        (minimal(n=2), "n: must be 1"),
        (minimal(messages=[]), "messages: List should have at least 1 item"),
        (
            minimal(messages=[{"role": "function", "content": "x", "name": "f"}]),
            "messages[0].role: Input should be",
        ),
        (
            minimal(messages=[{"role": "tool", "content": "x"}]),
            "messages[0].tool_call_id: required for role 'tool'",
        ),
        (
            minimal(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "messages[0].content[0].text: required string",
        ),
        (minimal(max_tokens=0), "max_tokens: Input should be greater than or equal to 1"),
        (minimal(stop=3), "stop: Input should be a valid string"),
        (
            minimal(stream_options={"include_usage": "yes"}),
            "stream_options.include_usage: Input should be a valid boolean",
        ),
        (
            minimal(tools=[{"type": "function", "function": {"description": "no name"}}]),
            "tools[0].function.name: Field required",
        ),
    ],
)
def test_invalid_requests_are_400_naming_the_field(body, message):
    with pytest.raises(InvalidRequest) as info:
        api.parse_chat_request(body)
    assert info.value.status == 400 and message in info.value.message


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
                                  {"type": "input_audio", "input_audio": {}}, {"type": "file", "file": {}}])  # fmt: skip
def test_media_parts_are_rejected_clearly(part):
    with pytest.raises(
        InvalidRequest, match=r"are not supported by this proxy \(messages\[0\]\.content\[1\]"
    ):
        api.parse_chat_request(
            minimal(messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, part]}])
        )


def test_request_serialised_by_the_sdk_is_accepted():
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(
            200, json=api.build_chat_completion(outcome("ok"), model="m", completion_id="c", created=1)
        )

    sdk_client(handler).chat.completions.create(
        model="m",
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
        ],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        tool_choice={"type": "function", "function": {"name": "f"}},
        max_completion_tokens=50,
        reasoning_effort="low",
        stream_options=None,
    )
    req = api.parse_chat_request(seen[0])
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[2]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert req.tool_choice == {"type": "function", "function": {"name": "f"}} and req.thinking is True


# ------------------------------------------------------------------------------ responses

TOOL_OUTCOME = outcome(
    content="",
    reasoning="Run the tests first.",
    calls=[
        ToolCall("call_A", "bash", {"command": "pytest -q", "note": "ünïcode"}),
        ToolCall("call_B", "read", {"filePath": "/app/a.py"}),
    ],
    finish="tool_calls",
)


def test_build_chat_completion_is_a_valid_sdk_object():
    completion = ChatCompletion.model_validate(
        api.build_chat_completion(TOOL_OUTCOME, model="tiny", completion_id="chatcmpl-1", created=1700000000)
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.reasoning_content == "Run the tests first."  # extra field kept by the SDK model
    assert [json.loads(tc.function.arguments) for tc in choice.message.tool_calls] == [
        {"command": "pytest -q", "note": "ünïcode"},
        {"filePath": "/app/a.py"},
    ]
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (200, 31, 231)


@pytest.mark.parametrize(
    "out, reason",
    [
        (outcome("done"), "stop"),
        (outcome("trunc", finish="length"), "length"),
        (TOOL_OUTCOME, "tool_calls"),
        (outcome("x", calls=[ToolCall("c", "f", {})], finish="stop"), "tool_calls"),
        (outcome("partial", finish="abort"), "stop"),
    ],
)
def test_finish_reasons(out, reason):
    assert (
        api.build_chat_completion(out, model="m", completion_id="c", created=1)["choices"][0]["finish_reason"]
        == reason
    )


def fold(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold chunks with the SDK's own accumulator; returns the final message and finish reason.

    Reads the accumulated snapshot: ``get_final_completion`` would raise on a length finish.
    """
    state = ChatCompletionStreamState()
    for c in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(c))
    final = state.current_completion_snapshot
    message = final.choices[0].message
    return {
        "content": message.content,
        "reasoning_content": getattr(message, "reasoning_content", None),
        "tool_calls": [
            (tc.id, tc.function.name, json.loads(tc.function.arguments)) for tc in message.tool_calls or []
        ],
        "finish_reason": final.choices[0].finish_reason,
        "usage": final.usage.model_dump() if final.usage else None,
    }


def expected(out: TurnOutcome) -> dict[str, Any]:
    body = api.build_chat_completion(out, model="m", completion_id="c", created=1)
    message = body["choices"][0]["message"]
    return {
        "content": message["content"],
        "reasoning_content": message.get("reasoning_content"),
        "tool_calls": [
            (tc["id"], tc["function"]["name"], json.loads(tc["function"]["arguments"]))
            for tc in message.get("tool_calls", [])
        ],
        "finish_reason": body["choices"][0]["finish_reason"],
    }


def test_stream_chunks_fold_into_the_non_streaming_message():
    chunks = list(
        api.stream_chunks(
            TOOL_OUTCOME, model="m", completion_id="c", created=1, include_usage=True, chunk_chars=3
        )
    )
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 231
    assert all(c["usage"] is None for c in chunks[:-1])
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    headers = [tc for d in deltas for tc in d.get("tool_calls", []) if "id" in tc]
    assert [(h["index"], h["id"], h["function"]["name"]) for h in headers] == [
        (0, "call_A", "bash"),
        (1, "call_B", "read"),
    ]
    folded = fold(chunks)
    assert folded.pop("usage")["total_tokens"] == 231
    assert folded == expected(TOOL_OUTCOME)


def test_stream_without_usage_has_no_usage_key():
    chunks = list(api.stream_chunks(outcome("hi"), model="m", completion_id="c", created=1))
    assert all("usage" not in c for c in chunks) and chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_sse_bytes_through_the_sdk_stream():
    """The SDK's own SSE reader (and its [DONE] handling) rebuilds the answer from our bytes."""
    out = outcome(
        content="Hello world. " * 40,
        reasoning="hmm " * 80,
        calls=[ToolCall("call_Z", "bash", {"command": "ls -la"})],
        finish="tool_calls",
    )

    def handler(request: httpx.Request) -> httpx.Response:
        frames = [api.SSE_KEEPALIVE]
        frames += [
            api.sse_chunk(c)
            for c in api.stream_chunks(
                out, model="tiny", completion_id="chatcmpl-9", created=5, include_usage=True
            )
        ]
        frames.append(api.SSE_DONE)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(frames))

    stream = sdk_client(handler).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    folded = fold([c.model_dump(exclude_unset=True) for c in chunks])
    assert folded.pop("usage")["prompt_tokens"] == 200
    assert folded == expected(out)


def echo_request(body: dict[str, Any]) -> dict[str, Any]:
    """The next request an OpenAI client sends: the returned message echoed back as is."""
    message = ChatCompletion.model_validate(body).choices[0].message.model_dump(exclude_none=True)
    return minimal(messages=[{"role": "user", "content": "go"}, message])


def test_echoed_message_parses_back_to_the_assistant_message():
    body = api.build_chat_completion(TOOL_OUTCOME, model="m", completion_id="c", created=1)
    assert api.parse_chat_request(echo_request(body)).messages[-1] == assistant_message(TOOL_OUTCOME.parsed)


parsed_outputs = st.builds(
    ParsedOutput,
    content=st.text(max_size=60),
    reasoning=st.none() | st.text(min_size=1, max_size=60),
    tool_calls=st.lists(
        st.builds(ToolCall, id=st.from_regex(r"call_[A-Za-z0-9]{4,12}", fullmatch=True), name=st.from_regex(r"[a-z_]{1,10}", fullmatch=True),
                  arguments=st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
        max_size=3,
    ),
)  # fmt: skip


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parsed=parsed_outputs, finish=st.sampled_from(["stop", "length", "tool_calls"]), chunk=st.integers(1, 40)
)
def test_property_stream_fold_and_echo_round_trip(parsed, finish, chunk):
    """Chunk boundaries never change the folded answer; echoing it restores the neutral message."""
    out = TurnOutcome(parsed, finish, 5, 7)
    chunks = list(api.stream_chunks(out, model="m", completion_id="c", created=1, chunk_chars=chunk))
    folded = fold(chunks)
    folded.pop("usage")
    want = expected(out)
    # The accumulator cannot tell "no content" from "": a stream without content deltas folds to None.
    assert folded == {**want, "content": want["content"] or None}
    body = api.build_chat_completion(out, model="m", completion_id="c", created=1)
    assert api.parse_chat_request(echo_request(body)).messages[-1] == assistant_message(parsed)


part = st.fixed_dictionaries(
    {"type": mostly(st.sampled_from(["text", "image_url", "refusal"]))}, optional={"text": mostly(short)}
)
valid_ish = st.fixed_dictionaries(
    {"model": mostly(short),
     "messages": mostly(st.lists(st.fixed_dictionaries(
         {"role": mostly(st.sampled_from(["system", "developer", "user", "assistant", "tool"]))},
         optional={"content": mostly(st.none() | short | st.lists(part, max_size=2)), "tool_call_id": mostly(short),
                   "reasoning_content": mostly(short), "name": json_values,
                   "tool_calls": mostly(st.lists(st.fixed_dictionaries({"id": mostly(short), "type": mostly(st.just("function")),
                       "function": st.fixed_dictionaries({"name": mostly(short), "arguments": mostly(st.sampled_from(['{"a":1}', "", "{", "[]"]))})}),
                       max_size=2))}), min_size=1, max_size=3))},
    optional={"n": mostly(st.integers(0, 2)), "stream": mostly(st.booleans()), "stop": mostly(short | st.lists(short, max_size=2)),
              "max_tokens": mostly(st.integers(0, 5)), "stream_options": mostly(st.fixed_dictionaries({"include_usage": mostly(st.booleans())})),
              "tools": mostly(st.lists(st.fixed_dictionaries({"type": mostly(st.just("function")),
                                                              "function": mostly(st.fixed_dictionaries({"name": mostly(short)}))}), max_size=2)),
              "tool_choice": json_values, "reasoning_effort": json_values, "chat_template_kwargs": json_values, "zz": json_values},
)  # fmt: skip


@settings(max_examples=examples(300), deadline=None)
@given(body=json_values)
def test_property_arbitrary_json_is_a_request_or_a_400(body):
    check_parse(body)


@settings(max_examples=examples(200), deadline=None)
@given(body=valid_ish)
def test_property_nearly_valid_bodies_are_a_request_or_a_400(body):
    check_parse(body)


def check_parse(body: Any) -> None:
    try:
        req = api.parse_chat_request(copy.deepcopy(body))
    except ProtocolError as e:
        assert e.status == 400 and e.message
    else:
        assert all(isinstance(m["content"], str) for m in req.messages)
        assert all(
            isinstance(tc["function"]["arguments"], dict)
            for m in req.messages
            for tc in m.get("tool_calls", ())
        )


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "err, status, kind, sdk_error",
    [
        (InvalidRequest("bad", param="messages[0]"), 400, "invalid_request_error", openai.BadRequestError),
        (NotFound("no such session"), 404, "not_found_error", openai.NotFoundError),
        (ReplicaUnreachable("all replicas down"), 503, "server_error", openai.InternalServerError),
        (BackendHTTPError(500, "oops"), 502, "server_error", openai.InternalServerError),
        (KeyError("bug"), 500, "server_error", openai.InternalServerError),
    ],
)
def test_errors_render_as_the_sdk_expects(err, status, kind, sdk_error):
    code, body = api.render_error(err)
    assert (code, body["error"]["type"]) == (status, kind)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    client = sdk_client(lambda request: httpx.Response(code, json=body), max_retries=0)
    with pytest.raises(sdk_error) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == status and info.value.type == kind


def test_context_exhausted_matches_openai_wording_and_code():
    code, body = api.render_error(ContextExhausted(5000, 4096))
    assert code == 400 and body["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in body["error"]["message"]
    client = sdk_client(lambda request: httpx.Response(code, json=body), max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert info.value.code == "context_length_exceeded"


def test_sse_error_and_framing():
    assert api.sse_error(ReplicaUnreachable("gone")).startswith(b'data: {"error":{"message":"gone"')
    assert api.sse_chunk({"a": 1}) == b'data: {"a":1}\n\n' and api.SSE_DONE == b"data: [DONE]\n\n"


def test_models_response():
    listing = openai.types.Model.model_validate(api.models_response(["tiny", "big"])["data"][1])
    assert listing.id == "big" and "max_model_len" not in api.models_response(["tiny"])["data"][0]
    # vLLM's own field: the session's context window, when known
    assert api.models_response(["tiny"], 5600)["data"][0]["max_model_len"] == 5600


def test_a_resent_tool_list_parses_the_same_and_a_bad_one_fails_every_time():
    """Tool lists are parsed once and found again by their JSON (proxy.wire.RecentParses): a
    scaffold's next request gets equal specs and the same ignored-field notes, and a request
    changing one schema value (``true`` -> ``1``) gets its own."""

    def tools(flag):
        return [
            {
                "type": "function",
                "function": {
                    "name": "bash",
                    "strict": True,
                    "parameters": {
                        "type": "object",
                        "properties": {"command": {"type": "string", "default": flag}},
                    },
                },
            }
        ]

    first, again = (api.parse_chat_request(minimal(tools=tools(True))) for _ in range(2))
    assert again.tools == first.tools and again.ignored_fields == first.ignored_fields == (
        "tools[].function.strict",
    )
    changed = api.parse_chat_request(minimal(tools=tools(1)))
    assert changed.tools[0]["function"]["parameters"]["properties"]["command"]["default"] is not True
    bad = [{"type": "function", "function": {"name": 5}}]
    for _ in range(2):
        with pytest.raises(InvalidRequest, match=r"tools\[0\]\.function\.name"):
            api.parse_chat_request(minimal(tools=bad))
