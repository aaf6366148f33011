"""Reward files written to attack the parser (issue 20, 7): nesting past the decoder,
integers past float range, files over the size limit, and reward.txt read exactly as Harbor
0.25 reads it (`float()` of the text; `Verifier._parse_reward_text`). Every bad file is a
ValueError naming why (an invalid reward), never another exception."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trialflow.verifier import REWARD_MAX_BYTES, _read_local, parse_reward_json, parse_reward_txt


def _harbor_txt(text: str) -> float | None:
    """Harbor 0.25's rule for reward.txt: `float(text)`, refused when not finite."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@pytest.mark.parametrize("depth", [10, 1000, 9000])
def test_deep_nesting_is_an_invalid_reward(depth):
    for text in ("[" * depth + "]" * depth, '{"a": ' * depth + "1" + "}" * depth):
        with pytest.raises(ValueError, match="nested too deeply|not a number|must be an object"):
            parse_reward_json(text)


def test_an_integer_past_float_range_or_digit_limit_is_invalid():
    with pytest.raises(ValueError, match="not finite"):
        parse_reward_json('{"reward": 1' + "0" * 400 + "}")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_reward_json('{"reward": 1' + "0" * 5000 + "}")  # Python's int digit limit


def test_underscores_and_spaces_read_as_harbor_reads_them():
    # Harbor 0.25 calls float() on the file: digit-group underscores are part of that syntax
    assert parse_reward_txt("1_0\n") == {"reward": 10.0} == {"reward": _harbor_txt("1_0\n")}
    assert parse_reward_txt(" +1e-3 ") == {"reward": 0.001}
    for bad in ("_1", "1__0", "1_", "1,0", "0x1", "1 0", ""):
        assert _harbor_txt(bad) is None
        with pytest.raises(ValueError):
            parse_reward_txt(bad)


def test_no_range_is_applied():
    # task.toml (Harbor 0.25's TaskConfig) declares no reward range: the verifier's number stands
    assert parse_reward_txt("7") == {"reward": 7.0}
    assert parse_reward_json('{"reward": -3}') == {"reward": -3.0}


def test_files_over_the_limit_are_refused_without_being_read_whole(tmp_path):
    big = tmp_path / "reward.txt"
    with big.open("wb") as f:  # a sparse file of 1 GiB apparent size
        f.truncate(1 << 30)
        f.seek(0)
        f.write(b"1")
    text = _read_local(big)
    assert text is not None and len(text) == REWARD_MAX_BYTES + 1
    with pytest.raises(ValueError, match="limit"):
        parse_reward_txt(text)
    with pytest.raises(ValueError, match="limit"):
        parse_reward_json('{"reward": 1}' + " " * REWARD_MAX_BYTES)
    assert parse_reward_json('{"reward": 1}' + " " * (REWARD_MAX_BYTES - 13)) == {"reward": 1.0}


@given(st.text(max_size=40))
def test_reward_txt_agrees_with_harbor_on_any_text(text):
    expected = _harbor_txt(text)
    if expected is None:
        with pytest.raises(ValueError):
            parse_reward_txt(text)
    else:
        assert parse_reward_txt(text) == {"reward": expected}


_json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=10,
)


@given(st.one_of(_json_values.map(repr), st.text(alphabet='{}[]":,0123456789.eE+-_ ', max_size=60)))
def test_reward_json_never_raises_anything_but_value_error(text):
    try:
        rewards = parse_reward_json(text)
    except ValueError:
        return
    assert rewards and all(isinstance(v, float) and math.isfinite(v) for v in rewards.values())
