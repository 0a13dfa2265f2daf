"""The Cython codec and the pure-Python reference produce identical bytes and results."""

from __future__ import annotations

import contextlib
import hashlib
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import applyloop, codec, usage
from store import format as ref
from store.ops import Op
from tests.strategies import entry_ops, owner_bytes, seqs, store_ops

if codec.IMPLEMENTATION != "cython":
    pytest.skip("Cython codec not in use (MERCURY_PURE=1)", allow_module_level=True)

from store import _codec as cy


def test_every_compiled_constant_equals_the_reference() -> None:
    """Cython needs its byte constants at compile time; each must equal format.py's."""
    assert cy.CONSTANTS
    for name, value in cy.CONSTANTS.items():
        assert getattr(ref, name) == value, name


@given(st.integers(0, 65535), st.integers(0, 25 << 20), st.integers(0, 255))
def test_usage_formula_is_the_one_in_usage(key_len: int, value_len: int, owner_len: int) -> None:
    assert cy.stored_bytes(key_len, value_len, owner_len) == usage.stored_bytes(
        key_len, value_len, owner_len
    )


@given(st.binary(max_size=3000), st.integers(min_value=0, max_value=2**32 - 1))
def test_crc32_matches_zlib(data: bytes, start: int) -> None:
    assert cy.crc32(data, start) == zlib.crc32(data, start)


@given(seqs, owner_bytes, st.binary(max_size=5000), st.booleans())
def test_encode_record_identical(seq: int, owner: bytes, value: bytes, chunked: bool) -> None:
    a = cy.encode_record(seq, owner, value, chunked)
    assert a == ref.encode_record(seq, owner, value, chunked)
    assert cy.decode_record_header(a) == ref.decode_record_header(a)
    if not chunked:
        assert cy.record_value(a) == ref.record_value(a) == value


@given(seqs, owner_bytes, st.binary(max_size=200), st.integers(min_value=0, max_value=300))
def test_flipped_byte_fails_crc_in_both(seq: int, owner: bytes, value: bytes, pos: int) -> None:
    rec = bytearray(ref.encode_record(seq, owner, value, False))
    i = pos % len(rec)
    if 14 <= i < 18 or i in (0, 18):
        return  # the CRC itself, the tag and the owner length are structural
    rec[i] ^= 0x40
    for impl in (cy, ref):
        with contextlib.suppress(ValueError):  # a flipped length is malformed: refused too
            assert impl.record_value(bytes(rec)) is None


@given(st.binary(min_size=32, max_size=32), st.binary(max_size=1000))
def test_chain_matches_hashlib_blake2b(prev: bytes, entry: bytes) -> None:
    want = hashlib.blake2b(prev + entry, digest_size=32).digest()
    assert cy.chain(prev, entry) == ref.chain(prev, entry) == want


@given(st.integers(min_value=1, max_value=2**40), st.lists(entry_ops, max_size=30))
def test_pack_and_unpack_identical(first: int, ops: list[tuple[int, bytes, bytes, bytes]]) -> None:
    ops = [(o, w, k, v if o == ref.OP_SET else b"") for o, w, k, v in ops]
    packed = cy.pack_entries(first, ops, ref.ZERO_HASH)
    assert packed == ref.pack_entries(first, ops, ref.ZERO_HASH)
    assert cy.unpack_entries(packed[0], ref.ZERO_HASH) == ref.unpack_entries(
        packed[0], ref.ZERO_HASH
    )


@given(st.binary(max_size=200))
def test_unpack_garbage_is_refused_alike(garbage: bytes) -> None:
    outcomes = []
    for impl in (cy, ref):
        try:
            outcomes.append(("ok", impl.unpack_entries(garbage, ref.ZERO_HASH)))
        except ValueError:
            outcomes.append(("err", None))
    assert outcomes[0] == outcomes[1]


class _NoChunks:
    def chunked_equal(self, seq: int, vlen: int, value: bytes) -> bool:
        raise AssertionError("no chunked values in this test")

    put_chunks = drop_chunks = chunked_equal


@settings(max_examples=150)
@given(st.lists(st.lists(store_ops(small_values=True), max_size=12), max_size=6))
def test_apply_loop_identical(batches: list[list[Op]]) -> None:
    """The per-op loop decides the same results, entries and usage deltas."""
    dbs: list[dict[bytes, bytes]] = [{}, {}]
    seqs_ = [0, 0]
    for batch in batches:
        outs = []
        for i, fn in enumerate((cy.apply_ops, applyloop.apply_ops)):
            d = dbs[i]
            out = fn(
                batch,
                d.get,
                d.__setitem__,
                d.__delitem__,
                seqs_[i],
                _NoChunks(),
                max(d) if d else None,
                lambda k, v, *_flags, d=d: d.__setitem__(k, v),  # append mode
            )
            seqs_[i] = out[2]
            outs.append(out)
        assert outs[0] == outs[1]
    assert dbs[0] == dbs[1]
