"""proxy.prefix_cache: header token ids reused across sessions, exact or not used at all."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.chat import ChatRequest
from proxy.prefix_cache import PrefixCache
from proxy.tokenization import ConversationTracker
from tests._hypothesis import examples
from tests.proxy._support import OPENAI_TOOLS

LONG_SYSTEM = "You are a careful coding agent. " * 200  # ~6.4K chars: above min_chars


def _encode(tok):
    return lambda text: tok.encode(text, add_special_tokens=False)


def _render(tok, user: str) -> str:
    return tok.apply_chat_template(
        [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": user}],
        tools=OPENAI_TOOLS,
        tokenize=False,
        add_generation_prompt=True,
    )


def test_second_prompt_with_the_same_header_is_a_hit_and_exact(tok):
    cache = PrefixCache(tok.eos_token)
    for user in ("fix the tests", "now add a README", "fix the tests"):
        text = _render(tok, user)
        assert cache.encode(text, _encode(tok)).tolist() == tok.encode(text, add_special_tokens=False)
    assert (cache.misses, cache.hits) == (1, 2)


def test_a_tokenizer_that_merges_across_the_boundary_is_never_split():
    """A toy encoder whose ids depend on the whole text: the split check fails on the first
    sight of the header and the header is never used split."""
    whole = lambda text: [len(text), hash(text) & 0x7FFFFFFF]  # noqa: E731
    cache = PrefixCache("<|im_end|>", min_chars=8)
    for tail in ("a", "bb", "a"):
        text = "header text<|im_end|>" + tail
        assert cache.encode(text, whole).tolist() == whole(text)
    assert cache.hits == 0 and cache.misses == 1


def test_short_headers_are_not_cached_and_old_ones_are_evicted(tok):
    cache = PrefixCache(tok.eos_token, max_entries=2)
    short = tok.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    cache.encode(short, _encode(tok))
    assert (cache.misses, cache.hits) == (0, 0)
    texts = [
        tok.apply_chat_template(
            [{"role": "system", "content": f"{i} " + LONG_SYSTEM}, {"role": "user", "content": "q"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for i in range(3)
    ]
    for t in texts:
        cache.encode(t, _encode(tok))
    cache.encode(texts[2], _encode(tok))  # still cached
    cache.encode(texts[0], _encode(tok))  # evicted by the third header
    assert (cache.misses, cache.hits) == (4, 1)


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(["<|im_end|>", "<|im_start|>", "\n", " x", "é", "<think>", "ab", "  "]), max_size=12
    ).map("".join)
)
def test_any_text_after_a_known_header_encodes_exactly(tok, rest):
    cache = PrefixCache(tok.eos_token)
    header = "<|im_start|>system\n" + LONG_SYSTEM + "<|im_end|>"
    cache.encode(header + "\n", _encode(tok))
    assert cache.encode(header + rest, _encode(tok)).tolist() == tok.encode(
        header + rest, add_special_tokens=False
    )


def test_sessions_share_the_cache_through_their_trackers(tok):
    cache = PrefixCache(tok.eos_token)
    prompts = []
    for user in ("first trial", "second trial"):
        tracker = ConversationTracker(tok, prefix_cache=cache)
        msgs = [{"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": user}]
        prepared = tracker.prepare(ChatRequest(protocol="openai", messages=msgs, tools=OPENAI_TOOLS))
        prompts.append(prepared.prompt_ids.tolist())
        text = tok.apply_chat_template(msgs, tools=OPENAI_TOOLS, add_generation_prompt=True, tokenize=False)
        assert prompts[-1] == tok.encode(text, add_special_tokens=False)
    assert cache.hits == 1


@settings(
    max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(
            ["<|im_end|>", "<|im_start|>", "\n", " x", "é", "ab", "  ", "tool output\n", "\t", "中"]
        ),
        max_size=40,
    ).map("".join),
    st.booleans(),
)
def test_a_long_rest_encoded_in_pieces_is_exact(tok, rest, long_header):
    """Pieces cut after later boundaries (tiny pieces here, so every cut is exercised), after
    a cached header or a short one (checked on each text, never cached)."""
    cache = PrefixCache(tok.eos_token, probe_chars=8, piece_chars=8)
    system = LONG_SYSTEM if long_header else "be brief"
    text = "<|im_start|>system\n" + system + "<|im_end|>" + rest
    for _ in range(2):  # a miss, then (long header) a hit
        assert cache.encode(text, _encode(tok)).tolist() == tok.encode(text, add_special_tokens=False)
    assert cache.hits == (1 if long_header else 0)


def test_long_texts_are_cut_after_boundaries_and_newlines_only_where_the_tokenizer_cuts():
    """With a character-level toy encoder (it cuts anywhere), cuts fall right after "|", after
    a newline that a non-space character follows, or before a space between non-spaces. A toy encoder whose ids depend on the
    whole text fails every cut's check: the text stays one piece."""
    chars = lambda t: [ord(c) for c in t]  # noqa: E731
    whole = lambda t: [len(t), hash(t) & 0x7FFFFFFF]  # noqa: E731
    cache = PrefixCache("|", piece_chars=4)
    text = "aaaaaa|b\n  \ncccccc\ndd" + "e" * 9 + " f  g" + "12+h"
    assert cache._next_cut(text, 4, chars) == 7  # after "|"
    assert cache._next_cut(text, 8, chars) == 12  # the newline at 8 is followed by spaces
    assert cache._next_cut(text, 13, chars) == 19
    assert cache._next_cut(text, 20, chars) == 30  # before " f"
    assert cache._next_cut(text, 31, chars) is None  # "  g12+h": no letter after a digit, one piece
    assert cache._next_cut(text + "3i", 31, chars) == len(text) + 1  # before the "i" after "3"
    assert cache._pieces(text, chars).tolist() == chars(text)
    assert cache._next_cut(text, 4, whole) is None
    assert cache._next_cut("abc1d", 1, whole) is None
    assert cache._pieces(text, whole).tolist() == whole(text)


def test_headers_longer_than_max_chars_are_not_cached_and_still_exact(tok):
    cache = PrefixCache(tok.eos_token, max_chars=len(LONG_SYSTEM) // 2, piece_chars=64)
    text = _render(tok, "fix the tests") + "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n" * 8
    for _ in range(2):
        assert cache.encode(text, _encode(tok)).tolist() == tok.encode(text, add_special_tokens=False)
    assert (cache.misses, cache.hits) == (0, 0) and not cache._entries


@settings(
    max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.sampled_from(
            [
                "def f(x):",
                "    return x",
                "",
                "  # é 中文 🙂",
                "x = [1, 2]",
                "\t\tindent",
                "<|im_end|>",
                "END",
                "  ",
            ]
        ),
        min_size=20,
        max_size=120,
    ).map("\n".join)
)
def test_one_long_message_cut_at_newlines_encodes_exactly(tok, body):
    """One message with no boundary inside: cut after newlines, checked, exact."""
    cache = PrefixCache(tok.eos_token, piece_chars=32)
    text = "<|im_start|>user\n" + body + "<|im_end|>\n<|im_start|>assistant\n"
    assert cache.encode(text, _encode(tok)).tolist() == tok.encode(text, add_special_tokens=False)


@settings(
    max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(0, 2**32), st.integers(600, 3000), st.sampled_from(["", "\n", " ", "<|im_end|>"]))
def test_a_base64_line_is_cut_before_letters_after_digits_and_encodes_exactly(tok, seed, size, end):
    """One line of base64 of random bytes (no newline, no space): cut before a letter that a
    digit precedes, checked, exact; several pieces, not one."""
    import base64
    import random

    data = random.Random(seed).randbytes(size)

    cache = PrefixCache(tok.eos_token, piece_chars=64)
    text = "<|im_start|>user\n" + base64.b64encode(data).decode() + end
    calls: list[str] = []
    enc = _encode(tok)
    ids = cache.encode(text, lambda t: calls.append(t) or enc(t))
    assert ids.tolist() == tok.encode(text, add_special_tokens=False)
    pieces = [t for t in calls if len(t) > 2 * 512]  # the pieces, not the cut checks' windows
    assert len(calls) > 3 and sum(map(len, pieces)) < len(text)
