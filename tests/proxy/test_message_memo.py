"""proxy.wire.MessageMemo: a resent history is converted once per session, with results that
are the same as converting it again (tool names resolved per request, errors never kept)."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy import anthropic_api, openai_api
from proxy.errors import InvalidRequest
from proxy.wire import MessageMemo

OPENAI_POOL = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "fix the tests"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "x"}],
        "name": "bob",
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})},
            }
        ],
    },
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}],
    },
    {"role": "assistant", "content": "done", "reasoning_content": "think"},
    {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
    {"role": "tool", "tool_call_id": "c1", "name": "own", "content": "a.py"},
    {"role": "tool", "tool_call_id": "c9", "content": "?"},
    # invalid ones: the memo must answer them exactly as a fresh parse does
    {"role": "tool", "content": "no id"},
    {
        "role": "assistant",
        "tool_calls": [{"id": "c2", "function": {"name": "bash", "arguments": "{not json"}}],
    },
    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
    {"role": "wizard", "content": "?"},
    5,
]

ANTHROPIC_POOL = [
    {"role": "user", "content": "fix the tests"},
    {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
        ],
    },
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "Read", "input": {}},
        ],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py", "cache_control": {}}],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "t1",
                "content": [{"type": "text", "text": "b"}],
                "is_error": True,
            },
            {"type": "text", "text": "and this"},
        ],
    },
    {"role": "system", "content": "reminder"},
    {"role": "assistant", "content": "plain"},
    # invalid ones
    {"role": "user", "content": [{"type": "image", "source": {}}]},
    {"role": "user", "content": ["hi"]},
    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
    "text",
]


def outcome(parse, body):
    try:
        req = parse(copy.deepcopy(body))
    except InvalidRequest as e:
        return ("error", e.message, e.param)
    return ("ok", req.messages, req.ignored_fields)


def histories(pool):
    return st.lists(
        st.lists(st.sampled_from(range(len(pool))), min_size=1, max_size=8), min_size=1, max_size=5
    )


@given(histories(OPENAI_POOL))
def test_openai_with_a_memo_parses_every_request_as_without(requests):
    memo = MessageMemo()
    for picks in requests:
        body = {"model": "m", "messages": [OPENAI_POOL[i] for i in picks]}
        assert outcome(lambda b: openai_api.parse_chat_request(b, memo), body) == outcome(
            openai_api.parse_chat_request, body
        )


@given(histories(ANTHROPIC_POOL))
def test_anthropic_with_a_memo_parses_every_request_as_without(requests):
    memo = MessageMemo()
    for picks in requests:
        body = {"model": "m", "max_tokens": 8, "system": "s", "messages": [ANTHROPIC_POOL[i] for i in picks]}
        assert outcome(lambda b: anthropic_api.parse_messages_request(b, memo), body) == outcome(
            anthropic_api.parse_messages_request, body
        )


def test_a_growing_history_is_converted_once_and_tool_names_follow_each_request():
    memo = MessageMemo()
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "a.py"}
    history = [{"role": "user", "content": "go"}, call, result]
    first = openai_api.parse_chat_request({"model": "m", "messages": history}, memo)
    assert (memo.misses, memo.hits) == (3, 0) and first.messages[2]["name"] == "bash"
    more = history + [{"role": "assistant", "content": "done"}, {"role": "user", "content": "thanks"}]
    second = openai_api.parse_chat_request({"model": "m", "messages": copy.deepcopy(more)}, memo)
    assert (memo.misses, memo.hits) == (5, 3) and second.messages[:3] == first.messages
    # the same tool result after a rewritten call: named after this request's call, and the
    # memo's shared message is not changed by the naming
    renamed = copy.deepcopy(call)
    renamed["tool_calls"][0]["function"]["name"] = "grep"
    third = openai_api.parse_chat_request({"model": "m", "messages": [history[0], renamed, result]}, memo)
    assert third.messages[2]["name"] == "grep" and first.messages[2]["name"] == "bash"
    assert (
        openai_api.parse_chat_request({"model": "m", "messages": history}, memo).messages[2]["name"] == "bash"
    )


def test_memo_is_bounded_and_keeps_no_failures():
    memo = MessageMemo(size=2)
    for text in ("a", "b", "c"):
        openai_api.parse_chat_request({"model": "m", "messages": [{"role": "user", "content": text}]}, memo)
    assert len(memo) == 2
    for _ in range(2):
        with pytest.raises(InvalidRequest, match=r"messages\[0\]\.tool_call_id"):
            openai_api.parse_chat_request(
                {"model": "m", "messages": [{"role": "tool", "content": "x"}]}, memo
            )
    assert len(memo) == 2 and memo.misses == 3


def test_memo_lets_go_of_a_history_the_client_stopped_sending():
    memo = MessageMemo(keep_requests=2)

    def send(*texts):
        openai_api.parse_chat_request(
            {"model": "m", "messages": [{"role": "user", "content": t} for t in texts]}, memo
        )

    send("old-1", "old-2")
    send("summary")  # compaction: the old history is gone from the requests
    send("summary", "next")
    assert len(memo) == 4  # the old messages were used by one of the last two requests
    misses = memo.misses
    send("summary", "next", "more")
    # now they were not: let go; what the client still resends stays (one new miss only)
    assert len(memo) == 3 and memo.misses == misses + 1
