"""A replica's per-entry work: the Cython kernel (`_codec.scan_entries`/`apply_entries`)
and its pure-Python twin (`store/replay.py`) accept, refuse, hash and apply alike."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store import chainhash, codec, replay
from store import format as ref
from store.ops import Op
from store.store import Store
from tests.conftest import assert_store_ok

if codec.IMPLEMENTATION != "cython":
    pytest.skip("Cython codec not in use (MERCURY_PURE=1)", allow_module_level=True)

from store import _codec as cy

_BIG = [b"x" * (ref.CHUNK_SIZE + 1), bytes(range(256)) * 40, b"\x07" * (3 * ref.CHUNK_SIZE)]
values = st.one_of(st.binary(max_size=40), st.sampled_from(_BIG))
owners = st.sampled_from([b"", b"alice", b"bob", "\u00e9t\u00e9".encode(), b"\xff\xfe"])
keys = st.sampled_from([b"a", b"b", b"c", b"\x00i", b"k" * 500])
# (op, owner, key, value): sets (chunked ones included), with a deadline or not, deletes,
# expiries and op-3 documents.
entries = st.one_of(
    st.tuples(st.just(ref.OP_SET), owners, keys, values),
    st.builds(
        lambda o, k, d, v: (ref.OP_SET_EXPIRING, o, k, ref.DEADLINE.pack(d) + v),
        owners,
        keys,
        st.sampled_from([0, 5, 2**63]),
        values,
    ),
    st.tuples(st.just(ref.OP_DELETE), owners, keys, st.just(b"")),
    st.tuples(st.just(ref.OP_EXPIRE), owners, keys, st.just(b"")),
    st.tuples(st.just(ref.OP_DOC), st.just(b""), st.sampled_from([b"acl", b"\x00ix"]), values),
)


@pytest.mark.parametrize("alg", ref.CHAINS)
def test_scan_of_a_big_record_hashes_alike_without_the_gil(alg: int) -> None:
    """A payload of 64 KiB and more is scanned with the GIL released: same head, and a
    flipped byte deep inside is still caught, with either chain hash."""
    ops = [(ref.OP_SET, b"o", b"k%d" % i, bytes([i]) * 20_000) for i in range(5)]
    payload, head = ref.pack_entries(9, ops, ref.ZERO_HASH, alg)
    assert len(payload) >= 65536
    assert cy.scan_entries(payload, ref.ZERO_HASH, 9, 5, alg) == head
    assert replay.scan_entries(payload, ref.ZERO_HASH, 9, 5, alg) == head
    bad = bytearray(payload)
    bad[70_000] ^= 1  # inside a value: the bytes still parse, only the chain changes
    assert cy.scan_entries(bytes(bad), ref.ZERO_HASH, 9, 5, alg) != head
    assert cy.scan_entries(bytes(bad), ref.ZERO_HASH, 9, 5, alg) == replay.scan_entries(
        bytes(bad), ref.ZERO_HASH, 9, 5, alg
    )
    with pytest.raises(ValueError, match="unknown chain hash"):
        cy.scan_entries(payload, ref.ZERO_HASH, 9, 5, 0)


def _outcome(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except ValueError as err:
        return "error", str(err)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=1, max_value=2**40),
    st.lists(entries, max_size=6),
    st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 255)), max_size=3),
    st.integers(-1, 40),
    st.integers(-1, 1),
    st.sampled_from(ref.CHAINS),
)
def test_scan_accepts_refuses_and_hashes_alike(
    first: int,
    ops: list[tuple[int, bytes, bytes, bytes]],
    flips: list[tuple[int, int]],
    cut: int,
    count_off: int,
    alg: int,
) -> None:
    """Valid payloads give the reference's hash head; damaged ones (flipped bytes, cut
    short, a wrong entry count) the same error in both, and exactly those breaking a rule
    of the format's spec (`_breaks_a_rule`) are refused."""
    prev = bytes(range(32))
    payload, head = ref.pack_entries(first, ops, prev, alg)
    assert cy.scan_entries(payload, prev, first, len(ops), alg) == head
    assert replay.scan_entries(payload, prev, first, len(ops), alg) == head
    raw = bytearray(payload)
    for i, b in flips:
        if raw:
            raw[i % len(raw)] = b
    if cut >= 0 and raw:
        raw = raw[: max(0, len(raw) - cut)]
    n = max(0, len(ops) + count_off)
    got = _outcome(cy.scan_entries, bytes(raw), prev, first, n, alg)
    assert got == _outcome(replay.scan_entries, memoryview(bytes(raw)), prev, first, n, alg)
    assert got[0] == ("error" if _breaks_a_rule(bytes(raw), first, n) else "ok")


def _breaks_a_rule(raw: bytes, first: int, n: int) -> bool:
    """Whether `raw` breaks a rule every entry of a received record must meet, read
    straight off the entry layout of the format's spec (seq u64, op u8, owner length u8,
    key length u16, value length u32, then owner, key and value; little-endian): an
    oracle apart from both twins, so a rule lost from both is still caught."""
    pos = count = 0
    while pos < len(raw):
        if pos + 16 > len(raw):
            return True
        seq = int.from_bytes(raw[pos : pos + 8], "little")
        op, on = raw[pos + 8], raw[pos + 9]
        kn = int.from_bytes(raw[pos + 10 : pos + 12], "little")
        vn = int.from_bytes(raw[pos + 12 : pos + 16], "little")
        if seq != first + count or not 1 <= op <= 5:  # set, delete, doc, set+deadline, expiry
            return True
        if not 1 <= kn <= ref.MAX_KEY:
            return True
        if op == 4:  # an 8-byte deadline, then a value of at most MAX_VALUE bytes
            if vn < 8 or vn - 8 > ref.MAX_VALUE:
                return True
        elif vn > ref.MAX_VALUE or (op in (2, 5) and vn):
            return True
        pos += 16 + on + kn + vn
        if pos > len(raw):
            return True
        count += 1
    return count != n


class _Rec:
    """A data sub-database, chunk store and docs over dicts, recording every call."""

    def __init__(self, data: dict[bytes, bytes]) -> None:
        self.data = dict(data)
        self.calls: list[tuple[Any, ...]] = []
        self.chunks: dict[int, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        self.calls.append(("get", key))
        return self.data.get(key)

    def put(self, key: bytes, rec: bytes) -> None:
        self.calls.append(("put", key, rec))
        self.data[key] = rec

    def append(self, key: bytes, rec: bytes, *flags: bool) -> None:
        assert flags == (True, True, True)  # LMDB's append mode, as the root's apply
        assert all(key > k for k in self.data), "appended a key that is not the last"
        self.calls.append(("append", key, rec))
        self.data[key] = rec

    def delete(self, key: bytes) -> None:
        self.calls.append(("delete", key))
        del self.data[key]

    def doc(self, seq: int, key: bytes, value: bytes) -> None:
        assert type(key) is bytes and type(value) is bytes
        self.calls.append(("doc", seq, key, value))

    def chunked_equal(self, seq: int, vlen: int, value: bytes) -> bool:
        raise AssertionError("a replica never compares values")

    def put_chunks(self, seq: int, value: Any) -> None:
        self.calls.append(("chunks", seq, bytes(value)))
        self.chunks[seq] = bytes(value)

    def drop_chunks(self, seq: int, vlen: int) -> None:
        self.calls.append(("drop", seq, vlen))

    def deadline(self, key: bytes) -> int:
        raise AssertionError("a replica never compares deadlines")

    def set_deadline(self, key: bytes, deadline_us: int) -> None:
        self.calls.append(("set_deadline", key, deadline_us))

    def clear_deadline(self, key: bytes) -> None:
        self.calls.append(("clear_deadline", key))


@st.composite
def stored_records(draw: st.DrawFn) -> dict[bytes, bytes]:
    """Records already stored under some keys: inline, chunked, by various owners."""
    out = {}
    for key in draw(st.lists(st.sampled_from([b"a", b"b", b"c", b"k" * 500]), unique=True)):
        value = draw(values)
        big = len(value) > ref.CHUNK_SIZE
        expires = draw(st.booleans())
        seq = draw(st.integers(1, 99))
        out[key] = ref.encode_record(key, seq, draw(owners), value, big, expires)
    return out


@settings(max_examples=300, deadline=None)
@given(
    st.data(),
    st.integers(min_value=100, max_value=2**40),
    st.lists(entries, max_size=8),
    st.booleans(),
)
def test_apply_entries_identical(
    data: st.DataObject, first: int, ops: list[tuple[int, bytes, bytes, bytes]], appending: bool
) -> None:
    """Same calls (gets, records put or appended past the largest key, deletes, chunks put
    and dropped, documents), the same usage deltas and the same largest key after, over the
    same stored records."""
    # A delete of a key with nothing stored is never logged: give those keys a record.
    stored = data.draw(stored_records())
    for op, _o, key, _v in ops:
        if op in (ref.OP_DELETE, ref.OP_EXPIRE) and key not in stored:
            stored[key] = ref.encode_record(key, 1, b"x", b"v", False)
    payload, _ = ref.pack_entries(first, ops, ref.ZERO_HASH)
    runs = []
    for fn in (cy.apply_entries, replay.apply_entries):
        r = _Rec(stored)
        delta: dict[str, list[int]] = {"seeded": [1, 2, 3, 4, 5, 6]}
        deleted_ok = True
        top = max(stored) if stored else None
        last: Any = "unset"
        try:
            if appending:
                last = fn(payload, r.get, r.put, r.delete, r, r.doc, delta, top, r.append)
            else:
                last = fn(payload, r.get, r.put, r.delete, r, r.doc, delta)
        except KeyError:  # a key deleted twice in one record: both fail alike
            deleted_ok = False
        runs.append((r.calls, r.data, r.chunks, delta, deleted_ok, last))
    assert runs[0] == runs[1]


@given(st.lists(entries, min_size=1, max_size=3), st.integers(1, 200))
def test_apply_entries_never_reads_past_a_cut_payload(
    ops: list[tuple[int, bytes, bytes, bytes]], cut: int
) -> None:
    """Called on bytes `scan_entries` would refuse (a misuse), both stop alike instead of
    reading past the buffer (what came before the cut may have been applied)."""
    payload, _ = ref.pack_entries(1, ops, ref.ZERO_HASH)
    raw = payload[: max(1, len(payload) - cut)]
    got = []
    for fn in (cy.apply_entries, replay.apply_entries):
        r = _Rec({})
        try:
            fn(raw, r.get, r.put, r.delete, r, r.doc, {})
            got.append(("ok", r.calls))
        except (ValueError, KeyError) as err:
            got.append((type(err).__name__, r.calls))
    assert got[0] == got[1]


def test_apply_entries_refuses_a_malformed_stored_record_alike() -> None:
    payload, _ = ref.pack_entries(5, [(ref.OP_SET, b"o", b"a", b"v")], ref.ZERO_HASH)
    for fn in (cy.apply_entries, replay.apply_entries):
        r = _Rec({b"a": b"\x02garbage-record-bytes"})
        with pytest.raises(ValueError, match="malformed value record"):
            fn(payload, r.get, r.put, r.delete, r, r.doc, {})


_POOL = [b"", b"v", b"w" * 100, _BIG[0], _BIG[1], _BIG[2]]
replica_ops = st.builds(
    lambda kind, key, v, owner, dl: Op(
        kind, key, v if kind == ref.OP_SET else b"", owner, None, dl if kind == ref.OP_SET else 0
    ),
    st.sampled_from([ref.OP_SET, ref.OP_SET, ref.OP_DELETE, ref.OP_EXPIRE]),
    st.sampled_from([b"a", b"b", b"c", b"z"]),
    st.sampled_from(_POOL),
    st.sampled_from(["", "alice", "bob"]),
    st.sampled_from([0, 0, 5, 9]),
)


def _logged_usage(store: Store) -> dict[str, tuple[int, int, int, int]]:
    """Usage a replica recomputes from the log: keys, bytes, writes, deletes (duplicates
    and throttling are counted by the root alone: they are never logged)."""
    out = {}
    for owner, u in store.usage().items():
        figures = (u.keys, u.bytes, u.writes, u.deletes)
        if any(figures):
            out[owner] = figures
    return out


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(replica_ops, min_size=1, max_size=12), min_size=1, max_size=5),
    st.integers(1, 3),
    st.sampled_from(sorted(chainhash.BY_NAME)),
)
def test_replicas_on_either_codec_equal_their_root(
    batches: list[list[Op]], group: int, chain: str
) -> None:
    """Real LMDB stores: a root's log applied to one replica with the Cython kernel and to
    another with the reference (in groups of `group` records per transaction) gives both
    the root's head, log, values, logged usage and chunk layout (overwrites and deletes of
    chunked values, appends past the last key included)."""
    with tempfile.TemporaryDirectory() as d:
        root = Store.create(f"{d}/root", sync=False, map_size=1 << 26, chain_hash=chain)
        reps = [
            Store.create(
                f"{d}/{i}", db_id=root.db_id, sync=False, map_size=1 << 26, chain_hash=chain
            )
            for i in (0, 1)
        ]
        try:
            root.put_docs({"acl": b'{"v": 1}'})
            for n, batch in enumerate(batches):
                root.apply(batch, time_us=1_000_000 + n)
            recs = root.read_log(1, max_records=1000)
            for impl, rep in zip(("cython", "python"), reps, strict=True):
                codec.use(impl)
                try:
                    for i in range(0, len(recs), group):
                        rep.apply_log_records(recs[i : i + group])
                finally:
                    codec.use("cython")
            for rep in reps:
                assert rep.head() == root.head()
                assert rep.read_log(1, max_records=1000) == recs
                assert _logged_usage(rep) == _logged_usage(root)
                assert rep.get_doc("acl") == root.get_doc("acl")
                with rep.reader() as a, root.reader() as b:
                    assert list(a.scan()) == list(b.scan())
                assert rep.stat()["entries_chunks"] == root.stat()["entries_chunks"]
                assert rep.due_expiries(10, 100) == root.due_expiries(10, 100)
                assert rep.stat()["entries_expiry"] == root.stat()["entries_expiry"]
                assert_store_ok(rep)
        finally:
            for s in (root, *reps):
                s.close()
