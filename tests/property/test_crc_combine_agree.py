"""`crc32_combine`: the Cython build (zlib's) and the pure-Python twin
(`store/crccombine.py`) agree with each other and with CRC-32 of the concatenation."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from store import _codec, crccombine


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=5000), st.integers(0, 2**32 - 1))
def test_combine_is_the_crc_of_the_concatenation(a: bytes, b: bytes, seed: int) -> None:
    whole = zlib.crc32(a + b, seed)
    ca, cb = zlib.crc32(a, seed), zlib.crc32(b)
    assert crccombine.crc32_combine(ca, cb, len(b)) == whole
    assert _codec.crc32_combine(ca, cb, len(b)) == whole


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**40))
def test_twins_agree_on_any_lengths(c1: int, c2: int, n: int) -> None:
    assert crccombine.crc32_combine(c1, c2, n) == _codec.crc32_combine(c1, c2, n)
