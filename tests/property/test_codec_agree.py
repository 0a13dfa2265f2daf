"""The Cython codec and the pure-Python reference produce identical bytes and results."""

from __future__ import annotations

import contextlib
import hashlib
import random
import tempfile
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import applyloop, codec, usage
from store import format as ref
from store.ops import Op
from store.store import Store
from tests.conftest import assert_store_ok
from tests.strategies import deadlines, entry_ops, owner_bytes, seqs, store_ops

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


@given(
    st.integers(0, 2**32 - 1),
    st.integers(0, 300_000),
    st.integers(0, 63),
    st.integers(0, 2**32 - 1),
)
def test_crc32_matches_zlib_on_large_unaligned_buffers(
    seed: int, length: int, skew: int, start: int
) -> None:
    """libdeflate switches between byte-wise, folding and carry-less-multiply loops by
    length and alignment; frames and chunked records reach hundreds of KiB."""
    data = memoryview(random.Random(seed).randbytes(length + skew))[skew:]
    assert cy.crc32(data, start) == zlib.crc32(data, start)


record_keys = st.binary(min_size=1, max_size=500)


@given(record_keys, seqs, owner_bytes, st.binary(max_size=5000), st.booleans())
def test_encode_record_identical(
    key: bytes, seq: int, owner: bytes, value: bytes, chunked: bool
) -> None:
    a = cy.encode_record(key, seq, owner, value, chunked)
    assert a == ref.encode_record(key, seq, owner, value, chunked)
    assert cy.decode_record_header(a) == ref.decode_record_header(a)
    if not chunked:
        assert cy.record_value(key, a) == ref.record_value(key, a) == value
    else:
        assert ref.check_chunked_record(key, a, value)


@given(record_keys, seqs, owner_bytes, st.binary(max_size=200), st.integers(0, 300))
def test_flipped_byte_fails_crc_in_both(
    key: bytes, seq: int, owner: bytes, value: bytes, pos: int
) -> None:
    rec = bytearray(ref.encode_record(key, seq, owner, value, False))
    i = pos % len(rec)
    if 14 <= i < 18 or i in (0, 18):
        return  # the CRC itself, the tag and the owner length are structural
    rec[i] ^= 0x40
    for impl in (cy, ref):
        with contextlib.suppress(ValueError):  # a flipped length is malformed: refused too
            assert impl.record_value(key, bytes(rec)) is None


@given(record_keys, seqs, owner_bytes, st.binary(max_size=200), st.integers(0, 499))
def test_flipped_key_byte_fails_crc_in_both(
    key: bytes, seq: int, owner: bytes, value: bytes, pos: int
) -> None:
    """The record is intact but stored under a key one bit off: both refuse it."""
    rec = ref.encode_record(key, seq, owner, value, False)
    bad = bytearray(key)
    bad[pos % len(bad)] ^= 0x01
    for impl in (cy, ref):
        assert impl.record_value(bytes(bad), rec) is None
        assert impl.record_value(key, rec) == value
    big = ref.encode_record(key, seq, owner, value, True)
    assert not ref.check_chunked_record(bytes(bad), big, value)


@given(st.binary(min_size=32, max_size=32), st.binary(max_size=1000))
def test_chain_matches_hashlib_blake2b(prev: bytes, entry: bytes) -> None:
    want = hashlib.blake2b(prev + entry, digest_size=32).digest()
    assert cy.chain(prev, entry) == ref.chain(prev, entry) == want
    assert cy.chain(prev, entry, ref.CHAIN_BLAKE2B) == want


@given(st.binary(min_size=32, max_size=32), st.binary(max_size=1000))
def test_chain_matches_hashlib_sha256(prev: bytes, entry: bytes) -> None:
    want = hashlib.sha256(prev + entry).digest()
    assert cy.chain(prev, entry, ref.CHAIN_SHA256) == ref.chain(prev, entry, ref.CHAIN_SHA256)
    assert ref.chain(prev, entry, ref.CHAIN_SHA256) == want


@pytest.mark.parametrize("alg", [0, 3, -1])
def test_an_unknown_chain_hash_is_refused_alike(alg: int) -> None:
    ops = [(ref.OP_SET, b"o", b"k", b"v")]
    payload, _ = ref.pack_entries(1, ops, ref.ZERO_HASH)
    for impl in (cy, ref):
        with pytest.raises(ValueError, match="unknown chain hash"):
            impl.chain(ref.ZERO_HASH, b"e", alg)
        with pytest.raises(ValueError, match="unknown chain hash"):
            impl.pack_entries(1, ops, ref.ZERO_HASH, alg)
        with pytest.raises(ValueError, match="unknown chain hash"):
            impl.unpack_entries(payload, ref.ZERO_HASH, alg)


@given(
    st.integers(min_value=1, max_value=2**40),
    st.lists(entry_ops, max_size=30),
    st.sampled_from(ref.CHAINS),
)
def test_pack_and_unpack_identical(
    first: int, ops: list[tuple[int, bytes, bytes, bytes]], alg: int
) -> None:
    ops = [(o, w, k, v if o == ref.OP_SET else b"") for o, w, k, v in ops]
    packed = cy.pack_entries(first, ops, ref.ZERO_HASH, alg)
    assert packed == ref.pack_entries(first, ops, ref.ZERO_HASH, alg)
    assert cy.unpack_entries(packed[0], ref.ZERO_HASH, alg) == ref.unpack_entries(
        packed[0], ref.ZERO_HASH, alg
    )
    if ops:  # the two hashes give two chains
        other = ref.CHAIN_SHA256 if alg == ref.CHAIN_BLAKE2B else ref.CHAIN_BLAKE2B
        assert packed[1] != cy.pack_entries(first, ops, ref.ZERO_HASH, other)[1]


@given(st.binary(max_size=200), st.sampled_from(ref.CHAINS))
def test_unpack_garbage_is_refused_alike(garbage: bytes, alg: int) -> None:
    outcomes = []
    for impl in (cy, ref):
        try:
            outcomes.append(("ok", impl.unpack_entries(garbage, ref.ZERO_HASH, alg)))
        except ValueError:
            outcomes.append(("err", None))
    assert outcomes[0] == outcomes[1]
    # decoding without the chain accepts and refuses exactly the same bytes
    for impl in (cy, ref):
        try:
            got = ("ok", impl.decode_entries(garbage))
        except ValueError:
            got = ("err", None)
        assert got == (outcomes[0][0], outcomes[0][1][0] if outcomes[0][1] else None)


@given(st.integers(min_value=1, max_value=2**40), st.lists(entry_ops, max_size=30))
def test_decode_entries_gives_the_entries_unpack_gives(
    first: int, ops: list[tuple[int, bytes, bytes, bytes]]
) -> None:
    ops = [(o, w, k, v if o == ref.OP_SET else b"") for o, w, k, v in ops]
    payload, _ = ref.pack_entries(first, ops, ref.ZERO_HASH)
    want, _ = ref.unpack_entries(payload, ref.ZERO_HASH)
    assert cy.decode_entries(payload) == ref.decode_entries(payload) == want
    assert cy.decode_entries(memoryview(payload)) == want  # the payload as a view


class _DictChunks:
    """`applyloop.Rare` over a dict: the chunked-value paths, with every call recorded so
    the two loops must also agree on what they ask of the chunk store."""

    def __init__(self) -> None:
        self.stored: dict[int, bytes] = {}
        self.deadlines: dict[bytes, int] = {}
        self.calls: list[tuple[str, int | bytes, int]] = []

    def chunked_equal(self, seq: int, vlen: int, value: bytes) -> bool:
        self.calls.append(("equal", seq, vlen))
        return self.stored[seq] == value

    def put_chunks(self, seq: int, value: bytes) -> None:
        self.calls.append(("put", seq, len(value)))
        assert len(value) > ref.CHUNK_SIZE
        self.stored[seq] = value

    def drop_chunks(self, seq: int, vlen: int) -> None:
        self.calls.append(("drop", seq, vlen))
        assert len(self.stored.pop(seq)) == vlen

    # The deadline index (`store/expiry.py`), recorded the same way.
    def deadline(self, key: bytes) -> int:
        self.calls.append(("deadline", key, 0))
        return self.deadlines.get(key, 0)

    def set_deadline(self, key: bytes, deadline_us: int) -> None:
        self.calls.append(("set_deadline", key, deadline_us))
        assert key not in self.deadlines  # cleared first
        self.deadlines[key] = deadline_us

    def clear_deadline(self, key: bytes) -> None:
        self.calls.append(("clear_deadline", key, 0))
        del self.deadlines[key]


def _big(fill: int, n: int) -> bytes:
    return bytes([fill]) * (n - 1) + b"!"


# A small pool, so that duplicates of chunked values happen: around the chunk boundary,
# and two big values of one length that differ only in content.
_POOL = [
    b"",
    b"a",
    b"bb",
    _big(1, ref.CHUNK_SIZE),
    _big(2, ref.CHUNK_SIZE + 1),
    _big(3, ref.CHUNK_SIZE + 1),
    _big(4, 3 * ref.CHUNK_SIZE + 7),
]
pooled_ops = st.builds(
    lambda kind, key, v, owner, expect, dl: Op(
        kind,
        key,
        v if kind == ref.OP_SET else b"",
        owner,
        expect,
        dl if kind == ref.OP_SET else 0,
    ),
    st.sampled_from([ref.OP_SET, ref.OP_SET, ref.OP_SET, ref.OP_DELETE, ref.OP_EXPIRE]),
    st.sampled_from([b"a", b"b", b"c", b"d"]),
    st.sampled_from(_POOL),
    st.sampled_from(["", "alice", "bob"]),
    st.one_of(st.none(), st.none(), st.integers(min_value=0, max_value=12)),
    deadlines,
)


@settings(max_examples=150)
@given(
    st.lists(st.lists(st.one_of(store_ops(small_values=True), pooled_ops), max_size=12), max_size=6)
)
def test_apply_loop_identical(batches: list[list[Op]]) -> None:
    """The per-op loop decides the same results, entries and usage deltas, chunked values
    (stored, compared as duplicates, dropped when overwritten or deleted) included."""
    dbs: list[dict[bytes, bytes]] = [{}, {}]
    rares = [_DictChunks(), _DictChunks()]
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
                rares[i],
                max(d) if d else None,
                d.update,  # append mode: runs of (key, record)
            )
            seqs_[i] = out[2]
            outs.append(out)
        assert outs[0] == outs[1]
    assert dbs[0] == dbs[1]
    assert rares[0].calls == rares[1].calls
    assert rares[0].stored == rares[1].stored
    assert rares[0].deadlines == rares[1].deadlines


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=2**40),
    st.lists(entry_ops, max_size=8),
    st.integers(min_value=65536, max_value=300_000),
    st.integers(min_value=0, max_value=8),
    st.sampled_from(ref.CHAINS),
)
def test_pack_entries_identical_on_big_batches(
    first: int, ops: list[tuple[int, bytes, bytes, bytes]], big: int, at: int, alg: int
) -> None:
    """Batches of 64 KiB and more hash their chain without the GIL: same bytes, same head."""
    ops = [(o, w, k, v if o == ref.OP_SET else b"") for o, w, k, v in ops]
    ops.insert(min(at, len(ops)), (ref.OP_SET, b"o", b"big", _big(7, big)))
    packed = cy.pack_entries(first, ops, ref.ZERO_HASH, alg)
    assert len(packed[0]) >= 65536
    assert packed == ref.pack_entries(first, ops, ref.ZERO_HASH, alg)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(pooled_ops, min_size=1, max_size=30), min_size=1, max_size=4))
def test_stores_on_either_codec_are_byte_identical(batches: list[list[Op]]) -> None:
    """Real LMDB stores, one applying every batch with the Cython codec and one with the
    reference: same results, same usage, same values and byte-identical logs (chunked
    values and batches past 64 KiB included)."""
    with tempfile.TemporaryDirectory() as d:
        stores = [Store.create(f"{d}/{i}", sync=False, map_size=1 << 26) for i in (0, 1)]
        try:
            for n, batch in enumerate(batches):
                outs = []
                for impl, s in zip(("cython", "python"), stores, strict=True):
                    codec.use(impl)
                    try:
                        outs.append(s.apply(batch, time_us=1_000_000 + n))
                    finally:
                        codec.use("cython")
                assert outs[0] == outs[1]
            a, b = stores
            assert a.head() == b.head()
            assert [r[4:] for r in a.read_log(1, max_records=100)] == [
                r[4:] for r in b.read_log(1, max_records=100)
            ]
            assert a.usage() == b.usage()
            with a.reader() as ra, b.reader() as rb:
                assert list(ra.scan()) == list(rb.scan())
            # Same layout too (inline or chunked alike), and no orphaned or missing chunk.
            assert a.stat()["entries_chunks"] == b.stat()["entries_chunks"]
            for s in stores:
                assert_store_ok(s)
        finally:
            for s in stores:
                s.close()
