"""proxy.anthropic_api against the official ``anthropic`` SDK: its request serialisation,
its response types, its SSE decoder and stream accumulator (run in-process over an httpx
MockTransport that answers with the bytes this module produces)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx  # the SDKs use httpx2 (an httpx fork) for their transports
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from proxy import anthropic_api as api
from proxy.chat import ParsedOutput, ToolCall, TurnOutcome, assistant_message
from proxy.errors import (
    BackendHTTPError,
    ContextExhausted,
    GenerationAborted,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    ReplicaUnreachable,
)
from tests._hypothesis import examples
from tests.proxy._strategies import json_values, mostly, short

FIXTURES = Path(__file__).parent / "fixtures"
EVENT = TypeAdapter(RawMessageStreamEvent)


def claude_code_body() -> dict[str, Any]:
    return json.loads((FIXTURES / "claude_code_messages.json").read_text())


def minimal(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


def outcome(content="", reasoning=None, calls=(), finish="stop", stop_sequence=None) -> TurnOutcome:
    parsed = ParsedOutput(content=content, reasoning=reasoning, tool_calls=list(calls))
    return TurnOutcome(parsed, finish, prompt_tokens=120, completion_tokens=37, stop_sequence=stop_sequence)


# ------------------------------------------------------------------------------ requests


def test_claude_code_request_translates_to_neutral_messages():
    req = api.parse_messages_request(claude_code_body())

    assert req.protocol == "anthropic" and req.model == "claude-sonnet-4-6"
    assert req.stream is True and req.thinking is True
    assert req.sampling.max_tokens == 32000 and req.sampling.temperature == 1
    assert [m["role"] for m in req.messages] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "system", "tool", "user",
    ]  # fmt: skip
    system, user, first, read, bash, edit, reminder, edited, last = req.messages
    assert (
        system["content"].startswith("x-anthropic-billing-header")
        and "\nYou are Claude Code" in system["content"]
    )
    assert user["content"].endswith("\nThe test in tests/test_math.py fails. Fix add() in math_utils.py.")
    assert first == {
        "role": "assistant",
        "content": "Let me look at the code.",
        "reasoning_content": "I should look at the file first.",
        "tool_calls": [
            {"id": "toolu_01A09q90qw90lq917835lq9", "type": "function",
             "function": {"name": "Read", "arguments": {"file_path": "/app/math_utils.py"}}},
            {"id": "toolu_01B7hZ3kXQ2f4d9e8c7b6a5", "type": "function",
             "function": {"name": "Bash", "arguments": {"command": "pytest -q tests/test_math.py",
                                                         "description": "Run the failing test"}}},
        ],
    }  # fmt: skip
    assert read == {"role": "tool", "tool_call_id": "toolu_01A09q90qw90lq917835lq9", "name": "Read",
                    "content": "     1\tdef add(a, b):\n     2\t    return a - b\n"}  # fmt: skip
    assert bash["is_error"] is True and bash["name"] == "Bash" and bash["content"].startswith("F\nFAILED")
    assert "is_error" not in read
    assert edit["content"] == "" and edit["tool_calls"][0]["function"]["name"] == "Edit"
    assert reminder == {
        "role": "system",
        "content": "<system-reminder>The TodoWrite tool hasn't been used recently.</system-reminder>",
    }
    assert edited["tool_call_id"] == "toolu_01C4mN8pQ2rS6tU0vW4xY8z" and edited["name"] == "Edit"
    assert last == {
        "role": "user",
        "content": "<system-reminder>Remember to run the tests.</system-reminder>",
    }

    assert [t["function"]["name"] for t in req.tools] == [
        "Task", "Bash", "Glob", "Grep", "ExitPlanMode", "Read", "Edit", "Write", "NotebookEdit", "WebFetch",
        "TodoWrite", "BashOutput",
    ]  # fmt: skip
    bash_tool = req.tools[1]
    assert bash_tool["type"] == "function"
    assert bash_tool["function"]["parameters"]["required"] == ["command"]
    assert set(req.ignored_fields) == {
        "context_management", "metadata", "output_config", "system[].cache_control",
        "messages[].content[].cache_control", "tools[].cache_control", "tools[].type=web_search_20250305",
    }  # fmt: skip


def test_user_message_with_only_tool_results_adds_no_empty_user_message():
    body = minimal(messages=[
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
    ])  # fmt: skip
    msgs = api.parse_messages_request(body).messages
    assert msgs[-1] == {"role": "tool", "tool_call_id": "t1", "name": "Bash", "content": ""}


def test_system_string_and_plain_contents():
    req = api.parse_messages_request(minimal(system="be brief", messages=[
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": []},
    ]))  # fmt: skip
    assert req.messages == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"}, {"role": "user", "content": ""},
    ]  # fmt: skip
    assert req.tools is None and req.tool_choice is None and req.thinking is None and req.stream is False
    assert req.sampling.top_k == -1 and req.sampling.stop == ()


def test_unknown_and_redacted_blocks_are_skipped_and_reported():
    req = api.parse_messages_request(minimal(messages=[
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "search_result_v9", "x": 1}]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "abc"}, {"type": "text", "text": "a"}]},
    ]))  # fmt: skip
    assert req.messages == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert set(req.ignored_fields) == {
        "messages[].content[].type=search_result_v9",
        "messages[].content[].type=redacted_thinking",
    }


def test_sampling_fields():
    req = api.parse_messages_request(
        minimal(temperature=0.2, top_p=0.9, top_k=20, stop_sequences=["</answer>", "STOP"], stream=True)
    )
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p, s.top_k, s.stop) == (
        16,
        0.2,
        0.9,
        20,
        ("</answer>", "STOP"),
    )


@pytest.mark.parametrize(
    "choice, expected",
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "Bash"}, {"type": "function", "function": {"name": "Bash"}}),
    ],
)
def test_tool_choice(choice, expected):
    assert api.parse_messages_request(minimal(tool_choice=choice)).tool_choice == expected


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"type": "adaptive"}, True),
        ({"type": "enabled", "budget_tokens": 2048}, True),
        ({"type": "disabled"}, False),
    ],
)
def test_thinking_config(config, expected):
    assert api.parse_messages_request(minimal(thinking=config)).thinking is expected


@pytest.mark.parametrize(
    "body, message",
    [
        ([1, 2], "request body: expected a JSON object, got array"),
        ({"messages": [], "max_tokens": 1}, "model: Field required"),
        (minimal(max_tokens="16"), "max_tokens: Input should be a valid integer"),
        (minimal(max_tokens=0), "max_tokens: Input should be greater than or equal to 1"),
        (minimal(max_tokens=True), "max_tokens: Input should be a valid integer"),
        (minimal(messages=[]), "messages: List should have at least 1 item"),
        (minimal(messages=[{"role": "bot", "content": "x"}]), "messages[0].role: Input should be"),
        (
            minimal(messages=[{"role": "user", "content": 3}]),
            "messages[0].content: Input should be a valid string",
        ),
        (
            minimal(messages=[{"role": "user", "content": [{"type": "text"}]}]),
            "messages[0].content[0].text: Field required",
        ),
        (
            minimal(messages=[{"role": "user", "content": ["hi"]}]),
            "messages[0].content[0]: Input should be a valid dictionary",
        ),
        (
            minimal(
                messages=[
                    {"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}
                ]
            ),
            "messages[0].content[0]: a tool_use block is not allowed here",
        ),
        (minimal(tool_choice={"type": "tool"}), "tool_choice.name: required"),
        (minimal(tools=[{"name": "x"}]), "tools[0].input_schema: Field required"),
        (minimal(thinking={"type": "sometimes"}), "thinking.type: Input should be"),
        (minimal(temperature=float("nan")), "temperature: Input should be a finite number"),
    ],
)
def test_invalid_requests_are_400_naming_the_field(body, message):
    with pytest.raises(InvalidRequest) as info:
        api.parse_messages_request(body)
    assert info.value.status == 400 and message in info.value.message


@pytest.mark.parametrize(
    "content, where",
    [
        (
            [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}],
            "messages[0].content[0]",
        ),
        (
            [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}],
            "messages[0].content[0].content[0]",
        ),
        ([{"type": "document", "source": {"type": "text", "data": "x"}}], "messages[0].content[0]"),
    ],
)
def test_images_and_documents_are_rejected_clearly(content, where):
    with pytest.raises(InvalidRequest) as info:
        api.parse_messages_request(minimal(messages=[{"role": "user", "content": content}]))
    assert "are not supported by this proxy" in info.value.message and where in info.value.message


def test_count_tokens_request_and_response():
    body = claude_code_body()
    for key in ("max_tokens", "stream", "temperature", "context_management", "metadata", "output_config"):
        body.pop(key)
    req = api.parse_count_tokens_request(body)
    assert req.messages == api.parse_messages_request(claude_code_body()).messages
    assert req.sampling.max_tokens is None
    assert api.count_tokens_response(4242) == {"input_tokens": 4242}


def test_request_serialised_by_the_sdk_is_accepted():
    """What ``anthropic.Anthropic().messages.create`` puts on the wire parses."""
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        msg = api.build_message(outcome("ok"), model="m", message_id="msg_1")
        return httpx.Response(200, json=msg)

    client = anthropic.Anthropic(
        api_key="x", base_url="http://proxy", http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    client.messages.create(
        model="m",
        max_tokens=64,
        system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}],
            },
        ],
        tools=[
            {
                "name": "f",
                "description": "d",
                "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
            }
        ],
        tool_choice={"type": "any"},
        thinking={"type": "enabled", "budget_tokens": 1024},
        stop_sequences=["X"],
    )
    req = api.parse_messages_request(seen[0])
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.tool_choice == "required" and req.thinking is True and req.sampling.stop == ("X",)


# ------------------------------------------------------------------------------ responses

TOOL_OUTCOME = outcome(
    content="I'll run the tests.",
    reasoning="The tests live in tests/.",
    calls=[
        ToolCall("toolu_01X", "Bash", {"command": "pytest -q", "description": "Run tests ✓"}),
        ToolCall("toolu_01Y", "Read", {"file_path": "/app/a.py"}),
    ],
    finish="tool_calls",
)


def test_build_message_is_a_valid_sdk_message():
    msg = Message.model_validate(api.build_message(TOOL_OUTCOME, model="tiny", message_id="msg_01"))
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert msg.content[0].signature.startswith("sha256:")
    assert msg.content[2].input == {"command": "pytest -q", "description": "Run tests ✓"}
    assert msg.stop_reason == "tool_use" and msg.stop_sequence is None
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (120, 37)


@pytest.mark.parametrize(
    "out, reason, sequence",
    [
        (outcome("done"), "end_turn", None),
        (outcome("trunc", finish="length"), "max_tokens", None),
        (outcome("x", finish="stop", stop_sequence="</answer>"), "stop_sequence", "</answer>"),
        (TOOL_OUTCOME, "tool_use", None),
        (outcome("", calls=[ToolCall("t", "f", {})], finish="stop"), "tool_use", None),
        (outcome("partial", finish="abort"), "end_turn", None),
    ],
)
def test_stop_reasons(out, reason, sequence):
    msg = api.build_message(out, model="m", message_id="msg_1")
    assert (msg["stop_reason"], msg["stop_sequence"]) == (reason, sequence)


def test_text_block_rules():
    def blocks(o: TurnOutcome) -> list[str]:
        return [b["type"] for b in api.build_message(o, model="m", message_id="i")["content"]]

    assert blocks(outcome("")) == []
    assert blocks(outcome("\n\n")) == ["text"]
    assert blocks(outcome("\n\n", calls=[ToolCall("t", "f", {})])) == ["tool_use"]
    assert blocks(outcome("hi", reasoning="")) == ["text"]


def fold(events: list[tuple[str, dict[str, Any]]]) -> Message:
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for name, data in events:
        event = EVENT.validate_python(data)
        assert event.type == name
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    return Message.model_validate(snapshot.model_dump())


def test_stream_events_fold_into_the_non_streaming_message():
    events = list(api.stream_events(TOOL_OUTCOME, model="tiny", message_id="msg_01", chunk_chars=4))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    deltas = [d["delta"]["type"] for n, d in events if n == "content_block_delta"]
    assert "signature_delta" in deltas and deltas.count("input_json_delta") >= 4
    folded = fold(events)
    assert folded == Message.model_validate(
        api.build_message(TOOL_OUTCOME, model="tiny", message_id="msg_01")
    )


def test_sse_bytes_through_the_sdk_stream():
    """The SDK's own SSE decoder and MessageStream rebuild the message from our bytes."""
    out = outcome(content="Hello\nworld " * 40, reasoning="Think. " * 50, finish="stop")

    def handler(request: httpx.Request) -> httpx.Response:
        frames = [api.sse(*api.ping_event())]
        frames += [
            api.sse(name, data) for name, data in api.stream_events(out, model="tiny", message_id="msg_2")
        ]
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=b"".join(frames))

    client = anthropic.Anthropic(
        api_key="x", base_url="http://proxy", http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    with client.messages.stream(
        model="tiny", max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == out.parsed.content
    assert final.content[0].thinking == out.parsed.reasoning and final.content[1].text == out.parsed.content
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 37


def test_sse_framing():
    assert api.sse("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'


def echo_request(msg: dict[str, Any]) -> dict[str, Any]:
    """The next request a client sends after receiving ``msg``: the assistant content echoed back."""
    return minimal(
        messages=[{"role": "user", "content": "go"}, {"role": "assistant", "content": msg["content"]}]
    )


def test_echoed_message_parses_back_to_the_assistant_message():
    msg = api.build_message(TOOL_OUTCOME, model="m", message_id="msg_1")
    assert api.parse_messages_request(echo_request(msg)).messages[-1] == assistant_message(
        TOOL_OUTCOME.parsed
    )


tool_calls = st.lists(
    st.builds(ToolCall, id=st.from_regex(r"toolu_[A-Za-z0-9]{4,12}", fullmatch=True), name=st.from_regex(r"[A-Za-z_]{1,10}", fullmatch=True),
              arguments=st.dictionaries(st.text(max_size=8), json_values, max_size=4)),
    max_size=3,
)  # fmt: skip
parsed_outputs = st.builds(
    ParsedOutput,
    content=st.text(max_size=60).filter(lambda s: s == "" or s.strip() != ""),
    reasoning=st.none() | st.text(min_size=1, max_size=60),
    tool_calls=tool_calls,
)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    parsed=parsed_outputs, finish=st.sampled_from(["stop", "length", "tool_calls"]), chunk=st.integers(1, 40)
)
def test_property_stream_fold_and_echo_round_trip(parsed, finish, chunk):
    """Chunk boundaries never change the folded message, and echoing it back restores the
    neutral assistant message (content that is only whitespace is excluded: see module doc)."""
    out = TurnOutcome(parsed, finish, 5, 7)
    msg = api.build_message(out, model="m", message_id="msg_p")
    assert fold(
        list(api.stream_events(out, model="m", message_id="msg_p", chunk_chars=chunk))
    ) == Message.model_validate(msg)
    assert api.parse_messages_request(echo_request(msg)).messages[-1] == assistant_message(parsed)


@settings(max_examples=examples(300), deadline=None)
@given(body=json_values)
def test_property_arbitrary_json_is_a_request_or_a_400(body):
    check_parse(body)


block = st.fixed_dictionaries(
    {
        "type": mostly(
            st.sampled_from(
                ["text", "tool_use", "tool_result", "thinking", "redacted_thinking", "image", "zzz"]
            )
        )
    },
    optional={
        "text": mostly(short),
        "id": mostly(short),
        "name": mostly(short),
        "tool_use_id": mostly(short),
        "input": mostly(st.dictionaries(short, json_values, max_size=2)),
        "thinking": mostly(short),
        "content": mostly(
            short | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": short}), max_size=2)
        ),
        "is_error": json_values,
        "cache_control": json_values,
    },
)
valid_ish = st.fixed_dictionaries(
    {"model": mostly(short), "max_tokens": mostly(st.integers(1, 5)),
     "messages": mostly(st.lists(st.fixed_dictionaries({
         "role": mostly(st.sampled_from(["user", "assistant", "system"])),
         "content": mostly(short | st.lists(mostly(block), max_size=3))}), min_size=1, max_size=3))},
    optional={"system": mostly(short), "stream": mostly(st.booleans()), "temperature": mostly(st.floats(0, 1)),
              "stop_sequences": mostly(st.lists(short, max_size=2)),
              "tool_choice": mostly(st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none"])},
                                                          optional={"name": short})),
              "thinking": mostly(st.fixed_dictionaries({"type": st.sampled_from(["enabled", "adaptive", "disabled"])})),
              "tools": mostly(st.lists(st.fixed_dictionaries({"name": mostly(short), "input_schema": mostly(st.just({}))},
                                                             optional={"type": json_values}), max_size=2)),
              "metadata": json_values, "zz": json_values},
)  # fmt: skip


@settings(max_examples=examples(200), deadline=None)
@given(body=valid_ish)
def test_property_nearly_valid_bodies_are_a_request_or_a_400(body):
    check_parse(body)


def check_parse(body: Any) -> None:
    for parse in (api.parse_messages_request, api.parse_count_tokens_request):
        try:
            req = parse(copy.deepcopy(body))
        except ProtocolError as e:
            assert e.status == 400 and e.message
        else:
            assert all(isinstance(m["content"], str) for m in req.messages)


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "err, status, kind, sdk_error",
    [
        (InvalidRequest("bad field"), 400, "invalid_request_error", anthropic.BadRequestError),
        (ContextExhausted(5000, 4096), 400, "invalid_request_error", anthropic.BadRequestError),
        (NotFound("no such session"), 404, "not_found_error", anthropic.NotFoundError),
        (PayloadTooLarge(50, 10), 413, "request_too_large", anthropic.APIStatusError),
        (ReplicaUnreachable("all replicas down"), 529, "overloaded_error", anthropic.InternalServerError),
        (GenerationAborted("aborted twice"), 529, "overloaded_error", anthropic.InternalServerError),
        (BackendHTTPError(500, "oops", "http://r1"), 502, "api_error", anthropic.InternalServerError),
        (RuntimeError("bug"), 500, "api_error", anthropic.InternalServerError),
    ],
)
def test_errors_render_as_the_sdk_expects(err, status, kind, sdk_error):
    code, body = api.render_error(err)
    assert (code, body["type"], body["error"]["type"]) == (status, "error", kind)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, json=body)

    client = anthropic.Anthropic(
        api_key="x",
        base_url="http://proxy",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    with pytest.raises(sdk_error) as info:
        client.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == status and body["error"]["message"] in str(info.value)


def test_context_exhausted_uses_the_wording_claude_code_matches():
    assert (
        api.render_error(ContextExhausted(5000, 4096))[1]["error"]["message"]
        == "prompt is too long: 5000 tokens > 4096 maximum"
    )


def test_error_event_mid_stream():
    name, data = api.error_event(ReplicaUnreachable("gone"))
    assert name == "error" and data == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "gone"},
    }


def test_models_response():
    assert api.models_response(["tiny"])["data"][0]["id"] == "tiny"


def test_a_resent_tool_list_parses_the_same_and_a_bad_one_fails_every_time():
    """See the OpenAI adapter's test of the same name (proxy.wire.RecentParses)."""

    def tools(flag):
        return [
            {
                "name": "Bash",
                "cache_control": {"type": "ephemeral"},
                "input_schema": {
                    "type": "object",
                    "properties": {"command": {"type": "string", "default": flag}},
                },
            }
        ]

    first, again = (api.parse_messages_request(minimal(tools=tools(True))) for _ in range(2))
    assert again.tools == first.tools and again.ignored_fields == first.ignored_fields
    assert "tools[].cache_control" in first.ignored_fields
    changed = api.parse_messages_request(minimal(tools=tools(1)))
    assert changed.tools[0]["function"]["parameters"]["properties"]["command"]["default"] is not True
    for _ in range(2):
        with pytest.raises(InvalidRequest, match=r"tools\[0\]\.name"):
            api.parse_messages_request(minimal(tools=[{"name": 5, "input_schema": {}}]))
