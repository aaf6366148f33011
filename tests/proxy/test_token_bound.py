"""proxy.token_bound and the tracker's early refusal (proxy.tokenization rule 6): the bound is
never above the real token count, on the tiny tokenizer and on family tokenizers, for random
texts and for texts built from each vocabulary's longest tokens (where the bound is tightest);
whenever ``prepare(request, budget=n)`` refuses, the full encoding has at least n tokens."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from proxy.chat import ChatRequest, Generation, ParsedOutput
from proxy.token_bound import TokenBound
from proxy.tokenization import ConversationTracker, OverBudget
from tests._hypothesis import examples
from trialflow.families import build_tokenizer_dir

FAMILIES = ("qwen3", "deepseek_v31", "llama31")  # BPE over bytes, the longest tokens differ
SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def toks(tok, tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    out = {"tiny": tok}
    for name in FAMILIES:
        out[name] = AutoTokenizer.from_pretrained(str(build_tokenizer_dir(name, root / name)))
    return out


def _longest_pieces(tok) -> list[str]:
    """The texts of the vocabulary's longest tokens (real bytes, decoded) and its added tokens."""
    bound = TokenBound.of(tok)
    assert bound is not None
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=True)
    ids = sorted(vocab.values())
    texts = [tok.decode([i]) for i in ids]
    cut = max(1, bound.longest // 2)
    return [t for t in texts if len(t.encode()) >= cut]


def _encode_len(tok, text: str) -> int:
    return len(tok.backend_tokenizer.encode(text, add_special_tokens=False).ids)


# random texts: any unicode (combining marks, astral characters), spaces, markup-like runs
TEXT = st.lists(
    st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from([" ", "\n", "  ", "\t", "<|im_end|>", "<think>", "=" * 16, "ab" * 8]),
    ),
    max_size=400,
).map("".join)


@pytest.mark.parametrize("name", ["tiny", *FAMILIES])
@SETTINGS
@given(data=st.data())
def test_the_bound_is_never_above_the_token_count(toks, name, data):
    tok = toks[name]
    bound = TokenBound.of(tok)
    assert bound is not None and bound is TokenBound.of(tok)  # computed once per tokenizer
    pieces = _longest_pieces(tok)
    parts = data.draw(st.lists(st.one_of(TEXT, st.sampled_from(pieces)), max_size=40))
    text = "".join(parts)
    n = _encode_len(tok, text)
    assert bound.at_least(text) <= n
    if text:
        assert bound.at_least(text) >= 1


@pytest.mark.parametrize("name", ["tiny", *FAMILIES])
def test_the_bound_is_tight_on_the_longest_tokens(toks, name):
    """Texts of the longest tokens alone: the bound is within a small factor of the count (a
    bound that is always 1 would pass the property test above)."""
    tok = toks[name]
    bound = TokenBound.of(tok)
    assert bound is not None
    longest = [t for t in _longest_pieces(tok) if len(t.encode()) == bound.longest]
    text = "".join(longest * 4)
    assert 0 < bound.at_least(text) <= _encode_len(tok, text) <= 4 * bound.at_least(text)


def test_byte_level_strings_count_their_real_bytes(toks):
    """A byte-level vocabulary string spells one byte per character: 'Ġ' (2 UTF-8 bytes) is one
    byte (a space). Counted by UTF-8 length the bound's divisor would be larger than any token."""
    tok = toks["tiny"]
    bound = TokenBound.of(tok)
    assert bound is not None
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=True)
    real = max(len(tok.decode([i]).encode()) for i in vocab.values())
    assert bound.longest == real


def _fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def test_no_bound_where_bytes_can_go_uncovered():
    """WordPiece's [UNK] is a whole word, a BPE without the byte alphabet drops what it cannot
    spell, a Whitespace pre-tokenizer removes spaces, Strip removes text: no bound for them."""
    wordpiece = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert TokenBound.of(_fast(wordpiece)) is None
    bpe = Tokenizer(models.BPE({"a": 0, "b": 1}, []))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert TokenBound.of(_fast(bpe)) is None  # not the whole byte alphabet
    alphabet = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    ok = Tokenizer(models.BPE(alphabet, []))
    ok.pre_tokenizer = pre_tokenizers.ByteLevel()
    assert TokenBound.of(_fast(ok)) == TokenBound(1)
    spaces = Tokenizer(models.BPE(alphabet, []))
    spaces.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.ByteLevel()])
    assert TokenBound.of(_fast(spaces)) is None
    strip = Tokenizer(models.BPE(alphabet, []))
    strip.pre_tokenizer = pre_tokenizers.ByteLevel()
    strip.normalizer = normalizers.Strip()
    assert TokenBound.of(_fast(strip)) is None


@SETTINGS
@given(
    text=st.text(
        alphabet=st.sampled_from(["e", "\u0301", "\u2126", "\ufb03", "K", "\u212a", " "]), max_size=200
    )
)
def test_a_unicode_normalizer_is_applied_before_measuring(text):
    """NFKC shrinks 'Ω' (3 bytes) to 'Ω' (2) and 'e'+U+0301 (3) to 'é' (2): the raw bytes would
    overcount; the bound measures the normalized text, as the tokenizer sees it."""
    alphabet = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(alphabet, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.normalizer = normalizers.NFKC()
    fast = _fast(tok)
    bound = TokenBound.of(fast)
    assert bound is not None and bound.longest == 1
    assert bound.at_least(text) == len(fast.backend_tokenizer.encode(text).ids)


def _request(messages) -> ChatRequest:
    return ChatRequest(protocol="openai", messages=messages)


@pytest.mark.parametrize("name", ["tiny", *FAMILIES])
@SETTINGS
@given(data=st.data())
def test_an_early_refusal_is_never_a_prompt_that_fits(toks, name, data):
    """prepare(request, budget) raises OverBudget only when the full prompt has >= budget
    tokens, for a new segment and for an extension of one; the refusal does not encode."""
    tok = toks[name]
    pieces = _longest_pieces(tok)
    body = st.lists(st.one_of(TEXT, st.sampled_from(pieces)), max_size=60).map("".join)
    tracker = ConversationTracker(tok)
    first = [{"role": "system", "content": "sys"}, {"role": "user", "content": data.draw(body)}]
    extend = data.draw(st.booleans())
    if extend:  # commit one reply, then the next user message is the (long) new text
        prepared = tracker.prepare(_request(first))
        ids = tok.encode("ok", add_special_tokens=False) + [tracker.eos_id]
        gen = Generation(prompt_token_ids=[], token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop")
        tracker.commit(prepared, gen, ParsedOutput(content="ok"))
        first = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": data.draw(body)}]
    request = _request(first)
    whole = tracker.prepare(request)
    assert whole.extends == extend
    full = len(whole.prompt_ids)
    budget = data.draw(st.integers(min_value=1, max_value=max(2, 2 * full)))
    try:
        prepared = tracker.prepare(request, budget)
    except OverBudget as over:
        assert budget <= over.at_least <= full
    else:
        assert len(prepared.prompt_ids) == full


def test_a_tokenizer_that_cannot_be_weakly_referenced_still_gets_its_bound(toks):
    class Slotted:  # no __weakref__: the per-tokenizer cache cannot hold it
        __slots__ = ("backend_tokenizer",)

    wrapper = Slotted()
    wrapper.backend_tokenizer = toks["tiny"].backend_tokenizer
    assert TokenBound.of(wrapper) == TokenBound.of(toks["tiny"])
