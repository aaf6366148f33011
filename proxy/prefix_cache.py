"""Token ids of long prompt headers, shared by the sessions of one proxy (pure, in memory).

A segment's first prompt is the whole rendered conversation, and most of it is the header
(system prompt plus tool list: ~41K tokens for Claude Code under the tiny tokenizer, ~0.1 s
to encode). Every trial of a scaffold sends the same header, and so do its rewritten
segments after compaction, so the proxy encodes it once:

    ids = cache.encode(text, encode)     # an int32 array

splits ``text`` right after the first occurrence of ``boundary`` (the end-of-turn special
token, e.g. ``<|im_end|>``, which closes the header's system turn) and returns
``ids(header) + encode(rest)``. This is exact because HF tokenizers split the input on
special tokens before any merging, so no token spans the boundary (the same fact the
tracker's rule 3 rests on). It is not taken on trust: when a header is first seen, the
encodes of header and rest are checked against the encode of the whole text, and a header
that fails (a tokenizer where the boundary is not a special token) is never split.

Headers shorter than ``min_chars`` are not cached (encoding them is cheap); at most
``max_entries`` headers are kept, least recently used evicted first.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable

from proxy import jsonio


class PrefixCache:
    def __init__(self, boundary: str, *, max_entries: int = 64, min_chars: int = 4096) -> None:
        if not boundary:
            raise ValueError("boundary must be a non-empty special-token text")
        self.boundary = boundary
        self.max_entries = max_entries
        self.min_chars = min_chars
        # header digest -> header ids, or None for a header that failed the split check
        self._entries: OrderedDict[bytes, array | None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def encode(self, text: str, encode: Callable[[str], list[int]]) -> array:
        """The ids of ``text`` as ``encode`` gives them (an 'i' array), reusing a known
        header's ids."""
        cut = text.find(self.boundary)
        if cut < 0 or cut + len(self.boundary) < self.min_chars:
            return array("i", encode(text))
        cut += len(self.boundary)
        key = jsonio.digest(text[:cut])
        if key in self._entries:
            header = self._entries[key]
            self._entries.move_to_end(key)
            if header is None:
                return array("i", encode(text))
            self.hits += 1
            return header + array("i", encode(text[cut:]))
        self.misses += 1
        full = encode(text)
        head, rest = encode(text[:cut]), encode(text[cut:])
        exact = len(head) + len(rest) == len(full) and full[: len(head)] == head and full[len(head) :] == rest
        self._store(key, array("i", head) if exact else None)
        return array("i", full)

    def _store(self, key: bytes, header: array | None) -> None:
        self._entries[key] = header
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
