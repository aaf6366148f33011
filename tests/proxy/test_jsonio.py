"""proxy.jsonio: orjson speed with the stdlib's acceptance rules."""

import json

import pytest

from proxy import jsonio


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "x", null, true]}', '"caf\\u00e9"', "[]", '{"n": -0.0}'])
def test_loads_matches_the_stdlib(text):
    assert jsonio.loads(text.encode()) == json.loads(text)


def test_loads_takes_what_only_the_stdlib_accepts():
    big = 2**70
    assert jsonio.loads(f'{{"id": {big}}}'.encode()) == {"id": big}
    assert json.dumps(jsonio.loads(b"[NaN]")) == "[NaN]"


@pytest.mark.parametrize("bad", [b"{", b"", b'{"a": 1,}', b"\xff\xfe"])
def test_loads_rejects_invalid_json_with_a_value_error(bad):
    with pytest.raises((ValueError, UnicodeDecodeError)):
        jsonio.loads(bad)


def test_dumps_is_compact_utf8_and_falls_back_for_big_ints_and_int_keys():
    assert jsonio.dumps({"a": "é", "b": [1, 2]}) == '{"a":"é","b":[1,2]}'.encode()
    assert json.loads(jsonio.dumps({"id": 2**70})) == {"id": 2**70}
    assert json.loads(jsonio.dumps({1: "x"})) == {"1": "x"}


def test_raw_json_is_embedded_as_is_and_survives_the_fallback():
    raw = jsonio.RawJSON(b"[1,2,3]")
    assert jsonio.dumps({"p": raw, "x": 1}) == b'{"p":[1,2,3],"x":1}'
    # a big int forces the stdlib fallback; the raw value still comes out the same
    assert json.loads(jsonio.dumps({"p": raw, "n": 2**70})) == {"p": [1, 2, 3], "n": 2**70}


def test_loads_refuses_lone_surrogates_even_on_the_fallback_path():
    with pytest.raises(ValueError, match="surrogate"):
        jsonio.loads(b'{"stop": ["\\ud800x"]}')
    assert jsonio.loads(b'{"s": "\\ud83d\\ude00", "n": 100000000000000000000000}')["s"] == "\U0001f600"
