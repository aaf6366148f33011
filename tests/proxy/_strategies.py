"""Hypothesis strategies shared by the protocol adapter tests."""

from __future__ import annotations

from hypothesis import strategies as st

# Any decoded JSON value (small), as a request body or inside one.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
short = st.text(max_size=4)


def mostly(good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` values, or now and then any JSON value in their place."""
    return st.one_of(good, good, good, json_values)
