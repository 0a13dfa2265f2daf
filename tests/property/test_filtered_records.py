"""Filtered log records (`store/filtered.py`): a replica of a keyspace subset recomputes
the source's chain head through skip items, holds exactly the kept entries, sees every
flipped kept byte, every wrong skip hash and every missing or extra entry, and a filtered
record filtered again to a narrower subset is what the narrower filter makes of the
original."""

from __future__ import annotations

import cramjam
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import filtered
from store import format as fmt
from store.nodedocs import ANSWER_PREFIX

keys = st.sampled_from([b"a/1", b"a/2", b"ab/3", b"b/1", b"b/a/2", b"c"])
values = st.binary(max_size=30)
entry = st.one_of(
    st.tuples(st.just(fmt.OP_SET), st.just(b"o"), keys, values),
    st.tuples(st.just(fmt.OP_DELETE), st.just(b"o"), keys, st.just(b"")),
    # format 7: a set with a deadline (8 bytes of it, then the value) and an expiry
    st.tuples(
        st.just(fmt.OP_SET_EXPIRING), st.just(b"o"), keys, values.map(lambda v: bytes(8) + v)
    ),
    st.tuples(st.just(fmt.OP_EXPIRE), st.just(b"o"), keys, st.just(b"")),
    st.tuples(
        st.just(fmt.OP_DOC), st.just(b""), st.sampled_from([b"acl", ANSWER_PREFIX + b"i"]), values
    ),
)
prefix_sets = st.sampled_from([[b"a/"], [b"a"], [b"b/", b"c"], [b"zz"], [b"a/", b"b/a/"]])
heads = st.sampled_from([fmt.ZERO_HASH, b"\x11" * 32])


def _record(first: int, ops: list[tuple[int, bytes, bytes, bytes]], prev: bytes, alg: int):
    raw, head = fmt.pack_entries(first, ops, prev, alg)
    packed = bytes(cramjam.snappy.compress_raw(raw))
    return fmt.encode_log_header(0, first, len(ops), 7, head, packed), packed, head, raw


def _raw(payload: bytes) -> bytes:
    return bytes(cramjam.snappy.decompress_raw(payload))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(entry, min_size=1, max_size=12),
    prefix_sets,
    heads,
    st.sampled_from(fmt.CHAINS),
    st.integers(1, 1000),
)
def test_filtered_record_verifies_and_holds_exactly_the_kept_entries(
    ops, prefixes, prev, alg, first
) -> None:
    header, payload, head, raw = _record(first, ops, prev, alg)
    keep = filtered.keeps(prefixes)
    fh, fp, fhead = filtered.filter_record(header, payload, prev, keep, alg)
    assert fhead == head
    lh = fmt.decode_log_header(fh)
    assert (lh.first_seq, lh.num_entries, lh.hash_head) == (first, len(ops), head)
    assert filtered.is_filtered(fh) and fmt.log_crc_ok(fh, fp)
    got_head, kept = filtered.scan(_raw(fp), prev, first, len(ops), alg)
    assert got_head == head
    want = [e for e in fmt.decode_entries(raw) if keep(e.op, e.key)]
    assert fmt.decode_entries(kept) == want
    assert fmt.decode_entries(filtered.entries_of(fh, _raw(fp))) == want
    # Documents pass every filter; idempotency answers none; user keys by prefix.
    for e in fmt.decode_entries(raw):
        if e.op == fmt.OP_DOC:
            assert keep(e.op, e.key) == (not e.key.startswith(ANSWER_PREFIX))
        else:
            assert keep(e.op, e.key) == filtered.under(e.key, prefixes)


@settings(max_examples=100, deadline=None)
@given(st.lists(entry, min_size=1, max_size=12), heads, st.data())
def test_refiltering_to_a_subset_equals_filtering_the_original(ops, prev, data) -> None:
    header, payload, head, _ = _record(5, ops, prev, fmt.CHAIN_SHA256)
    wide = filtered.keeps([b"a", b"b/"])
    narrow_prefixes = data.draw(st.sampled_from([[b"a/"], [b"ab"], [b"b/a/"], [b"a", b"b/"]]))
    narrow = filtered.keeps(narrow_prefixes)
    fh, fp, _ = filtered.filter_record(header, payload, prev, wide, fmt.CHAIN_SHA256)
    nh, np_, nhead = filtered.filter_record(fh, fp, prev, narrow, fmt.CHAIN_SHA256)
    dh, dp, _ = filtered.filter_record(header, payload, prev, narrow, fmt.CHAIN_SHA256)
    assert nhead == head
    assert (nh, _raw(np_)) == (dh, _raw(dp))
    assert filtered.scan(_raw(np_), prev, 5, len(ops), fmt.CHAIN_SHA256)[0] == head


@settings(max_examples=150, deadline=None)
@given(st.lists(entry, min_size=2, max_size=12), prefix_sets, st.data())
def test_every_altered_byte_of_a_filtered_payload_is_seen(ops, prefixes, data) -> None:
    """Flip any byte of the filtered payload (kept entry, skip count, either skip hash):
    the scan refuses it or ends on another head than the record's."""
    header, payload, head, _ = _record(3, ops, fmt.ZERO_HASH, fmt.CHAIN_BLAKE2B)
    _fh, fp, _ = filtered.filter_record(header, payload, fmt.ZERO_HASH, filtered.keeps(prefixes))
    items = bytearray(_raw(fp))
    i = data.draw(st.integers(0, len(items) - 1))
    items[i] ^= data.draw(st.integers(1, 255))
    try:
        got, _kept = filtered.scan(bytes(items), fmt.ZERO_HASH, 3, len(ops))
    except ValueError:
        return
    assert got != head


@settings(max_examples=60, deadline=None)
@given(st.lists(entry, min_size=2, max_size=12), prefix_sets)
def test_a_replica_on_another_chain_is_told(ops, prefixes) -> None:
    """A replica whose head before the record differs from the source's (another history)
    ends on another head or is stopped at the first skip item: never silently applied."""
    header, payload, head, _ = _record(3, ops, fmt.ZERO_HASH, fmt.CHAIN_BLAKE2B)
    _fh, fp, _ = filtered.filter_record(header, payload, fmt.ZERO_HASH, filtered.keeps(prefixes))
    try:
        got, _ = filtered.scan(_raw(fp), b"\x22" * 32, 3, len(ops))
    except filtered.SkipMismatch:
        return
    assert got != head


def test_a_missing_or_extra_entry_is_a_numbering_error() -> None:
    ops = [(fmt.OP_SET, b"o", b"a/%d" % i, b"v") for i in range(3)] + [
        (fmt.OP_SET, b"o", b"b/x", b"v")
    ]
    header, payload, _head, _ = _record(10, ops, fmt.ZERO_HASH, fmt.CHAIN_BLAKE2B)
    _fh, fp, _ = filtered.filter_record(header, payload, fmt.ZERO_HASH, filtered.keeps([b"a/"]))
    with pytest.raises(ValueError, match="header says"):
        filtered.scan(_raw(fp), fmt.ZERO_HASH, 10, 5)
    items = _raw(fp)
    first_entry = fmt.ENTRY_HEADER.size + 1 + 3 + 1
    with pytest.raises(ValueError, match="expected 10"):
        filtered.scan(items[first_entry:], fmt.ZERO_HASH, 10, 4)
