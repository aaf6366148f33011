"""proxy.wire: strict validation with field-path messages, ignored-field names, pieces."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import InvalidRequest
from proxy.wire import RecentParses, WireModel, generic, note_unused, pieces, validate


class Inner(WireModel):
    text: str
    cache_control: dict | None = None


class Outer(WireModel):
    n: int
    items: list[Inner] = []
    either: str | list[Inner] | None = None


def test_strict_types_and_field_paths():
    assert validate(Outer, {"n": 1, "items": [{"text": "a"}]}).items[0].text == "a"
    for data, message in [
        ({"n": "1"}, "n: Input should be a valid integer"),
        ({"n": True}, "n: Input should be a valid integer"),
        ({"n": 1, "items": [{"text": "a"}, {}]}, "items[1].text: Field required"),
        ({"n": 1, "either": 5}, "either: Input should be a valid string or Input should be a valid list"),
        ({}, "n: Field required"),
    ]:
        with pytest.raises(InvalidRequest) as info:
            validate(Outer, data)
        assert info.value.message == message and info.value.status == 400


def test_non_object_and_nested_path():
    with pytest.raises(InvalidRequest, match=r"^request body: expected a JSON object, got array$"):
        validate(Outer, [])
    with pytest.raises(InvalidRequest, match=r"^tools\[2\]: expected a JSON object, got null$"):
        validate(Outer, None, "tools[2]")
    with pytest.raises(InvalidRequest) as info:
        validate(Inner, {"text": 1}, "messages[0].content[3]")
    assert info.value.param == "messages[0].content[3].text"


def test_unused_fields_are_named_generically():
    block = validate(Inner, {"text": "a", "cache_control": {}, "zz": 1})
    ignored: set[str] = set()
    note_unused(block, "messages[4].content[2]", {"cache_control"}, ignored)
    assert ignored == {"messages[].content[].cache_control", "messages[].content[].zz"}
    assert generic("a[1].b[22].c") == "a[].b[].c"


@given(s=st.text(max_size=50), size=st.integers(-3, 60))
def test_pieces_rejoin(s, size):
    parts = pieces(s, size)
    assert "".join(parts) == s and all(0 < len(p) <= max(size, 1) for p in parts)


def test_recent_parses_reuses_a_result_for_the_same_json_only():
    calls = []

    def parse(value):
        calls.append(value)
        return ("parsed", len(calls))

    recent = RecentParses(parse, size=2)
    first = recent([{"a": 1, "b": True}])
    assert recent([{"a": 1, "b": True}]) is first and len(calls) == 1  # an equal fresh value: reused
    # Python equality would call these the same; their JSON (and a template's rendering) differs
    for other in ([{"a": 1, "b": 1}], [{"a": 1.0, "b": True}], [{"b": True, "a": 1}]):
        assert recent(other) is not first
    assert len(calls) == 4
    # least recently used first out: the first value was pushed out by the last two
    recent([{"a": 1, "b": True}])
    assert len(calls) == 5


def test_recent_parses_does_not_remember_a_failure():
    def parse(value):
        if value == ["bad"]:
            raise InvalidRequest("bad")
        return value

    recent = RecentParses(parse)
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            recent(["bad"])
