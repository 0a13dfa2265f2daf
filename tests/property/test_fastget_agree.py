"""The compiled point-read replies (`reads/_fastget.pyx`) equal the pure-Python reference
(`reads/fastget.py`) byte for byte, and the reference equals what the general encoders
write: memcached's `encode_values` and uvicorn's framing of `pointget.point_get`'s headers."""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from memcached import protocol as mc
from reads import fastget, pointget
from store import format as fmt

try:
    from reads import _fastget as cy  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - `make build` builds it
    pytest.skip("reads._fastget is not built (make build)", allow_module_level=True)

keys = st.binary(min_size=1, max_size=500)
seqs = st.integers(min_value=0, max_value=2**64 - 1)
owners = st.binary(max_size=60)
values = st.binary(max_size=3000)


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(key, record): mostly good inline records; some chunked, corrupted, truncated or
    stored under another key (so the CRC fails)."""
    key = draw(keys)
    rec = fmt.encode_record(key, draw(seqs), draw(owners), draw(values), draw(st.booleans()))
    how = draw(st.sampled_from(["good", "good", "good", "flip", "cut", "other-key", "junk"]))
    if how == "flip":
        i = draw(st.integers(0, len(rec) - 1))
        rec = rec[:i] + bytes([rec[i] ^ (1 << draw(st.integers(0, 7)))]) + rec[i + 1 :]
    elif how == "cut":
        rec = rec[: draw(st.integers(0, len(rec)))]
    elif how == "other-key":
        key = key + b"x"
    elif how == "junk":
        rec = draw(st.binary(max_size=64))
    return key, rec


@given(records(), st.booleans(), st.booleans())
def test_mc_value_agrees(kr: tuple[bytes, bytes], with_cas: bool, flags: bool) -> None:
    key, rec = kr
    assert cy.mc_value(key, rec, with_cas, flags) == fastget.mc_value(key, rec, with_cas, flags)


@given(records(), st.binary(max_size=200), seqs, st.booleans(), st.booleans())
def test_http_value_agrees(
    kr: tuple[bytes, bytes], head: bytes, applied: int, head_only: bool, close: bool
) -> None:
    key, rec = kr
    assert cy.http_value(head, key, rec, applied, head_only, close) == fastget.http_value(
        head, key, rec, applied, head_only, close
    )


@given(keys, seqs, owners, values, st.booleans(), st.booleans())
def test_reference_writes_what_encode_values_writes(
    key: bytes, seq: int, owner: bytes, value: bytes, with_cas: bool, flags: bool
) -> None:
    rec = fmt.encode_record(key, seq, owner, value, False)
    block = fastget.mc_value(key, rec, with_cas, flags)
    assert block is not None
    assert block + mc.END == mc.encode_values([(key, value, seq)], with_cas, flags)


@given(keys, seqs, owners, values)
def test_none_for_anything_not_served_inline(
    key: bytes, seq: int, owner: bytes, value: bytes
) -> None:
    chunked = fmt.encode_record(key, seq, owner, value, True)
    assert fastget.mc_value(key, chunked, False, False) is None
    assert cy.mc_value(key, chunked, False, False) is None
    good = fmt.encode_record(key, seq, owner, value, False)
    assume(len(good) > fmt.RECORD_FIXED)
    bad = good[:-1] + bytes([good[-1] ^ 1])
    assert fastget.http_value(b"", key, bad, 1, False, False) is None
    assert cy.http_value(b"", key, bad, 1, False, False) is None


@given(st.binary(max_size=100) | st.text(alphabet="%0aF/x", max_size=30).map(str.encode))
def test_key_of_is_percent_decoding(raw: bytes) -> None:
    assert pointget.key_of(pointget.KV_PREFIX + raw) == unquote_to_bytes(raw)
