"""`check(store)`: the store's invariants, verified by reading everything once.

- keys come out of the data tree strictly increasing (a damaged key or page breaks the
  order the B-tree's searches rely on);
- every value record decodes and its CRC holds over its key and value (chunked ones
  reassembled), no chunk is orphaned or missing;
- the retained log is contiguous from ``log_first_seq`` to ``last_seq``, each record's CRC
  holds, and the hash chain (the store's chain hash) from ``log_base_hash`` reproduces
  every record's head and the meta ``hash_head``;
- the format version is the one this code writes, and the store names its chain hash;
- usage counters (keys, bytes) equal a recount from the data, and so do the per-keyspace
  figures of owners with several keyspaces when they claim to be current;
- every replicated document is the one its latest retained log entry wrote, and none is
  missing or left over (`store/docs.py:check`).

Run in the teardown of every test that uses a store, and by `mercury verify`. Reads in one
read transaction (a consistent view); on a live node that holds back page reuse for as long
as it runs, which is why `verify` is an operator action, not a background job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cramjam

from store import chainhash, chunks, codec, docs, expiry, filtered
from store.counters import check_keyspaces
from store.format import (
    CHUNK_SIZE,
    FLAG_CHUNKED,
    FLAG_EXPIRES,
    LOG_HEADER,
    OP_DOC,
    check_chunked_record,
    decode_log_header,
    log_crc_ok,
)
from store.layout import (
    BE64,
    K_CHAIN_HASH,
    K_FORMAT,
    K_HASH_HEAD,
    K_LAST_SEQ,
    K_LOG_BASE_HASH,
    K_LOG_FIRST,
    U32,
    U64,
)
from store.store import CURRENT_FORMAT, Store
from store.usage import Usage, stored_bytes

Progress = Callable[[int], object]
MAX_LISTED = 50


@dataclass
class CheckReport:
    """What `check` found. `ok` when `problems` is empty."""

    values: int = 0
    log_entries: int = 0
    log_records: int = 0
    problems: list[str] = field(default_factory=list)
    #: How many problems there were in all (only the first `MAX_LISTED` are listed).
    problem_count: int = 0

    @property
    def ok(self) -> bool:
        """True when no invariant is broken."""
        return self.problem_count == 0

    def add(self, problem: str) -> None:
        """Record one broken invariant."""
        self.problem_count += 1
        if len(self.problems) < MAX_LISTED:
            self.problems.append(problem)


def work_units(store: Store) -> int:
    """How many progress units `check` reports (values + log records), for a progress bar."""
    with store.env.begin() as txn:
        return int(txn.stat(store.dbs.data)["entries"] + txn.stat(store.dbs.log)["entries"])


def check(store: Store, progress: Progress | None = None) -> CheckReport:
    """Verify every invariant of `store`; never raises for a broken invariant, reports it.

    A damaged file can make LMDB itself fail mid-walk (a page that is not a page, a
    missing meta value): that is reported as the file being unreadable from there on,
    never raised, so `mercury verify` always ends with a report.
    """
    report = CheckReport()
    tick = progress or (lambda n: None)
    phase = "meta"
    try:
        with store.env.begin() as txn:
            meta = store.dbs.meta
            version = U32.unpack(txn.get(K_FORMAT, db=meta))[0]
            if version != CURRENT_FORMAT:
                report.add(f"format version {version}, expected {CURRENT_FORMAT}")
            if version >= 6 and txn.get(K_CHAIN_HASH, db=meta) is None:
                report.add("meta records no chain hash (format 6 and later always do)")
            phase = "data"
            live_chunks = _check_data(store, txn, report, tick)
            phase = "log"
            logged: dict[bytes, tuple[int, bytes]] = {}
            before = report.problem_count
            _check_log(store, txn, report, tick, live_chunks, logged)
            if report.problem_count == before:  # documents are checked against a sound log
                phase = "docs"
                for problem in docs.check(txn, store.dbs, logged):
                    report.add(problem)
            phase = "chunks"
            _check_chunks(store, txn, report, live_chunks)
    except Exception as err:  # LMDB, struct or decode errors on a damaged file
        report.add(f"store unreadable while checking {phase}: {type(err).__name__}: {err}")
    return report


def _check_data(store: Store, txn: Any, report: CheckReport, tick: Progress) -> set[bytes]:
    recount: dict[str, Usage] = {}
    live: set[bytes] = set()
    flagged: set[bytes] = set()
    prev: bytes | None = None
    for key, rec in txn.cursor(db=store.dbs.data):
        report.values += 1
        tick(1)
        key = bytes(key)
        if prev is not None and key <= prev:
            report.add(f"key {key!r} out of order after {prev!r} (damaged key or page)")
        prev = key
        try:
            h = codec.decode_record_header(rec)
        except ValueError:
            report.add(f"key {key!r}: malformed value record")
            continue
        if h.flags & FLAG_CHUNKED:
            value = chunks.get(txn, store.dbs.chunks, chunks.VALUE_NS, h.seq, h.vlen)
            if value is None:
                report.add(f"key {key!r}: chunks missing")
            elif not check_chunked_record(key, bytes(rec), value):
                report.add(f"key {key!r}: CRC mismatch (chunked value)")
            n = (h.vlen + CHUNK_SIZE - 1) // CHUNK_SIZE
            live.update(_chunk_keys(chunks.VALUE_NS, h.seq, n))
        elif codec.record_value(key, rec) is None:
            report.add(f"key {key!r}: CRC mismatch")
        if h.flags & FLAG_EXPIRES:
            flagged.add(key)
        u = recount.setdefault(h.owner, Usage())
        u.keys += 1
        u.bytes += stored_bytes(len(key), h.vlen, h.owner_len)
    if store.format_version >= 2:
        stored = store.usage()
        for owner in set(recount) | set(stored):
            want = recount.get(owner, Usage())
            got = stored.get(owner, Usage())
            if (got.keys, got.bytes) != (want.keys, want.bytes):
                report.add(
                    f"usage of {owner!r}: counters say {got.keys} keys / {got.bytes} bytes, "
                    f"recount {want.keys} keys / {want.bytes} bytes"
                )
        last = U64.unpack(txn.get(K_LAST_SEQ, db=store.dbs.meta))[0]
        for problem in check_keyspaces(txn, store.dbs.data, store.dbs.meta, last):
            report.add(problem)
    if store.dbs.expiry is not None:
        for problem in expiry.check(txn, store.dbs.expiry, flagged):
            report.add(problem)
    return live


def _check_log(
    store: Store,
    txn: Any,
    report: CheckReport,
    tick: Progress,
    live: set[bytes],
    logged: dict[bytes, tuple[int, bytes]],
) -> None:
    meta = store.dbs.meta
    last = U64.unpack(txn.get(K_LAST_SEQ, db=meta))[0]
    head = bytes(txn.get(K_HASH_HEAD, db=meta))
    expect = U64.unpack(txn.get(K_LOG_FIRST, db=meta))[0]
    h = bytes(txn.get(K_LOG_BASE_HASH, db=meta))
    alg = chainhash.read(txn, meta)
    hdr = LOG_HEADER.size
    for k, v in txn.cursor(db=store.dbs.log):
        report.log_records += 1
        tick(1)
        first = BE64.unpack(k)[0]
        try:
            lh = decode_log_header(bytes(v[:hdr]))
        except ValueError:
            report.add(f"log record at seq {first}: malformed header")
            return
        if lh.first_seq != first or first != expect:
            report.add(f"log gap or disorder: expected seq {expect}, record starts at {first}")
            return
        if len(v) == hdr and lh.plen > 0:
            payload = chunks.get(txn, store.dbs.chunks, chunks.LOG_NS, first, lh.plen)
            n = (lh.plen + CHUNK_SIZE - 1) // CHUNK_SIZE
            live.update(_chunk_keys(chunks.LOG_NS, first, n))
            if payload is None:
                report.add(f"log record at seq {first}: chunks missing")
                return
        else:
            payload = bytes(v[hdr:])
        if not log_crc_ok(bytes(v[:hdr]), payload):
            report.add(f"log record at seq {first}: CRC mismatch")
            return
        try:
            raw = bytes(cramjam.snappy.decompress_raw(payload))
            if filtered.is_filtered(bytes(v[:hdr])):
                # A keyspace-filtered replica's record: the chain runs through its skip
                # items (`store/filtered.py`); its kept entries are checked below.
                h, raw = filtered.scan(raw, h, first, lh.num_entries, alg)
                entries = codec.decode_entries(raw)
            else:
                entries, h = codec.unpack_entries(raw, h, alg)
        except Exception as err:  # a corrupt payload can fail in snappy or in the decoder
            report.add(f"log record at seq {first}: undecodable payload ({err})")
            return
        if filtered.is_filtered(bytes(v[:hdr])):
            pass  # `scan` checked the numbering of its entries and skip items
        elif len(entries) != lh.num_entries or any(
            e.seq != first + i for i, e in enumerate(entries)
        ):
            report.add(f"log record at seq {first}: entries not contiguous")
            return
        if h != lh.hash_head:
            report.add(f"hash chain broken at log record {first}")
            return
        report.log_entries += lh.num_entries
        logged.update((e.key, (e.seq, e.value)) for e in entries if e.op == OP_DOC)
        expect = first + lh.num_entries
    if expect != last + 1:
        report.add(f"log ends at seq {expect - 1} but meta says last seq {last}")
    elif h != head:
        report.add("hash chain head differs from meta hash_head")


def _check_chunks(store: Store, txn: Any, report: CheckReport, live: set[bytes]) -> None:
    for k, _v in txn.cursor(db=store.dbs.chunks):
        if bytes(k) not in live:
            ns, seq, idx = chunks.parse_key(bytes(k))
            report.add(f"orphan chunk {ns!r} seq {seq} index {idx}")


def _chunk_keys(ns: bytes, seq: int, n: int) -> list[bytes]:
    return [chunks.key(ns, seq, i) for i in range(n)]
