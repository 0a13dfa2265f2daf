"""A cache node's connection to its source (HELLO mode 3): the invalidation stream and the
answers to its misses. Both ends' codecs live here; the source side is `serve`.

Why a mode of its own: a cache holds a small part of the store, so shipping it every value
written (RECORD frames) would cost the bandwidth of a full replica. Mode 3 ships, per log
record, its last seq and each key it changed with the seq of that change — never a value —
and the cache fetches what it misses on the same connection.

Bodies (integers little-endian):

- ``INVALIDATE`` (source -> cache): first and last seq of the record (u64 each: the cache
  checks each continues the last, as a replica does), count n (u32), then n
  times: seq (u64), key length (u16), key. Every entry but a replicated document (op 3:
  not a key readers see) is listed: a set, a delete and any later op (an expiry) alike.
  One frame per record, in seq order from the HELLO's last seq + 1.
- ``FETCH`` (cache -> source): request id (u32), min seq (u64), count n (u16, at most
  `MAX_FETCH_KEYS`), then n times: key length (u16), key.
- ``FETCHED`` (source -> cache): request id (u32), status (u8: 0 read, 1 the source is
  behind min seq — it waited `FETCH_WAIT` for it), read seq (u64: the seq of the read
  transaction every value comes from; with status 1, the source's last seq), count n
  (u16; 0 with status 1), then n times in the FETCH's order: present (u8), version (u64:
  the key's last change; 0 when absent), value length (u32), value. With status 0, n is
  at least 1 and may be fewer than the keys asked: the answer stops once its values pass
  `FETCH_BYTES` (values are up to 25 MiB each), and the cache asks again for the rest.

HEARTBEAT frames are sent as on a stream (the root's relayed clock, `sent_seq` the last
INVALIDATE's seq), so the cache computes its lag exactly as a replica does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

import snappy

from core.errors import CRCError, LogRetentionError, ProtocolError
from replicator import frames
from replicator.transport import Frame, Link
from store import codec
from store.format import MAX_KEY, OP_DOC
from store.ops import LogRecord

if TYPE_CHECKING:
    from replicator.source import ReplicationSource

log = logging.getLogger("mercury.replication.invalidation")

#: Keys per FETCH (a cache's get_bulk asks for at most this many at once).
MAX_FETCH_KEYS = 1000
#: FETCH frames a source answers at once per connection; a cache that sends more is cut
#: (it bounds its own misses in flight well below this).
MAX_INFLIGHT = 256
#: How long a source waits for its own seq to reach a FETCH's min seq before answering
#: "behind" (a cache that failed over to a source behind what it already applied).
FETCH_WAIT = 2.0
#: Bytes of values one FETCHED carries at most (beyond its first value): what a cache can
#: make its source read and hold per request.
FETCH_BYTES = 16 << 20
#: Records read per log read while streaming invalidations.
READ_RECORDS = 256
READ_BYTES = 4 << 20

STATUS_READ = 0
STATUS_BEHIND = 1

_INV = struct.Struct("<QQI")
_INV_KEY = struct.Struct("<QH")
_FETCH = struct.Struct("<IQH")
_KEY = struct.Struct("<H")
_FETCHED = struct.Struct("<IBQH")
_ITEM = struct.Struct("<BQI")


class Invalidation(NamedTuple):
    """One record's invalidations: its seqs, and (seq, key) of each change."""

    first_seq: int
    last_seq: int
    changes: list[tuple[int, bytes]]


class Fetch(NamedTuple):
    request: int
    min_seq: int
    keys: list[bytes]


class Item(NamedTuple):
    """One key of an answer: its value (None: absent) and version (0: absent)."""

    value: bytes | None
    version: int


class Fetched(NamedTuple):
    request: int
    status: int
    read_seq: int
    items: list[Item]


# --- codecs --------------------------------------------------------------------------


def encode_invalidate(inv: Invalidation) -> bytes:
    parts = [_INV.pack(inv.first_seq, inv.last_seq, len(inv.changes))]
    for seq, key in inv.changes:
        parts.append(_INV_KEY.pack(seq, len(key)))
        parts.append(key)
    return frames.encode_frame(frames.INVALIDATE, b"".join(parts))


def decode_invalidate(body: bytes | bytearray) -> Invalidation:
    mv = memoryview(body)
    try:
        first, last, n = _INV.unpack_from(mv, 0)
        pos = _INV.size
        changes = []
        for _ in range(n):
            seq, kn = _INV_KEY.unpack_from(mv, pos)
            pos += _INV_KEY.size
            if not 1 <= kn <= MAX_KEY or pos + kn > len(mv):
                raise ProtocolError("INVALIDATE: bad key")
            changes.append((seq, bytes(mv[pos : pos + kn])))
            pos += kn
    except struct.error as err:
        raise ProtocolError(f"INVALIDATE truncated: {err}") from err
    if pos != len(mv):
        raise ProtocolError("INVALIDATE: trailing bytes")
    return Invalidation(first, last, changes)


def encode_fetch(f: Fetch) -> bytes:
    parts = [_FETCH.pack(f.request, f.min_seq, len(f.keys))]
    for key in f.keys:
        parts.append(_KEY.pack(len(key)))
        parts.append(key)
    return frames.encode_frame(frames.FETCH, b"".join(parts))


def decode_fetch(body: bytes | bytearray) -> Fetch:
    mv = memoryview(body)
    try:
        req, min_seq, n = _FETCH.unpack_from(mv, 0)
        if n > MAX_FETCH_KEYS:
            raise ProtocolError(f"FETCH of {n} keys (at most {MAX_FETCH_KEYS})")
        pos = _FETCH.size
        keys = []
        for _ in range(n):
            (kn,) = _KEY.unpack_from(mv, pos)
            pos += _KEY.size
            if not 1 <= kn <= MAX_KEY or pos + kn > len(mv):
                raise ProtocolError("FETCH: bad key")
            keys.append(bytes(mv[pos : pos + kn]))
            pos += kn
    except struct.error as err:
        raise ProtocolError(f"FETCH truncated: {err}") from err
    if pos != len(mv):
        raise ProtocolError("FETCH: trailing bytes")
    return Fetch(req, min_seq, keys)


def encode_fetched(f: Fetched) -> bytes:
    parts = [_FETCHED.pack(f.request, f.status, f.read_seq, len(f.items))]
    for value, version in f.items:
        if value is None:
            parts.append(_ITEM.pack(0, 0, 0))
        else:
            parts.append(_ITEM.pack(1, version, len(value)))
            parts.append(value)
    return frames.encode_frame(frames.FETCHED, b"".join(parts))


def decode_fetched(body: bytes | bytearray) -> Fetched:
    mv = memoryview(body)
    try:
        req, status, read_seq, n = _FETCHED.unpack_from(mv, 0)
        pos = _FETCHED.size
        items = []
        for _ in range(n):
            present, version, vn = _ITEM.unpack_from(mv, pos)
            pos += _ITEM.size
            if pos + vn > len(mv):
                raise ProtocolError("FETCHED: value runs past the frame")
            items.append(Item(bytes(mv[pos : pos + vn]) if present else None, version))
            pos += vn
    except struct.error as err:
        raise ProtocolError(f"FETCHED truncated: {err}") from err
    if pos != len(mv):
        raise ProtocolError("FETCHED: trailing bytes")
    return Fetched(req, status, read_seq, items)


def changes_of(rec: LogRecord) -> Invalidation:
    """The invalidations of a log record (its CRC was checked when it was stored)."""
    entries = codec.decode_entries(snappy.decompress(rec.payload))
    return Invalidation(
        rec.first_seq, rec.last_seq, [(e.seq, e.key) for e in entries if e.op != OP_DOC]
    )


# --- the source's side ---------------------------------------------------------------


async def serve(source: ReplicationSource, hello: frames.Hello, link: Link, head: int) -> None:
    """Stream invalidations from the HELLO's last seq + 1 (newest-only: from `head` + 1, the
    head the WELCOME named) and answer FETCH frames until the link ends (the caller has sent
    WELCOME)."""
    store = source.store
    pos = head + 1 if hello.newest_only else hello.last_seq + 1
    ev = asyncio.Event()
    # Woken by every commit, as the source's streams are (`ReplicationSource.wake`).
    source._waiters[ev] = None
    answering: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()

    def on_frame(frame: Frame) -> None:
        if frame.type != frames.FETCH:
            raise ProtocolError(f"unexpected frame type {frame.type} from a cache")
        if len(answering) >= MAX_INFLIGHT:
            raise ProtocolError(f"more than {MAX_INFLIGHT} FETCH frames in flight")
        task = loop.create_task(_answer(source, link, decode_fetch(frame.body)))
        answering.add(task)
        task.add_done_callback(answering.discard)

    reading = link.push(on_frame, frozenset({frames.FETCH}))
    interval = source.heartbeat.interval_ms / 1000
    last_hb_at = -interval
    try:
        while not reading.done():
            ev.clear()
            # What was committed last is at hand in the source's tail (a stream caught up
            # reads nothing: a round trip through a worker thread costs tens of ms on a
            # busy root); older records are read in a worker thread.
            recs = source._tail.after(pos, store.last_seq())
            try:
                if recs is None:
                    recs = await asyncio.to_thread(
                        store.read_log, pos, max_records=READ_RECORDS, max_bytes=READ_BYTES
                    )
            except LogRetentionError as err:
                link.write(frames.encode_refuse(frames.REFUSE_BOOTSTRAP, str(err)))
                await link.drain(source.stall_timeout)
                return
            for rec in recs:
                link.write(encode_invalidate(changes_of(rec)))
                pos = rec.last_seq + 1
            if recs:
                await link.drain(source.stall_timeout)
                if len(recs) >= READ_RECORDS:
                    continue
            now = loop.time()
            hb = source.heartbeat.current()
            if hb is not None and now - last_hb_at >= interval:
                link.write(frames.encode_heartbeat(hb._replace(sent_seq=pos - 1)))
                await link.drain(source.stall_timeout)
                last_hb_at = now
            timeout = max(0.0, interval - (loop.time() - last_hb_at))
            waiter = loop.create_task(ev.wait())
            either: set[asyncio.Future[Any]] = {waiter, reading}
            try:
                await asyncio.wait(either, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
        failure = reading.exception()
        if failure is not None:
            raise failure
    finally:
        source._waiters.pop(ev, None)
        for t in list(answering):
            t.cancel()
        for t in list(answering):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


async def _answer(source: ReplicationSource, link: Link, f: Fetch) -> None:
    """Answer one FETCH: wait (bounded) until this node applied its min seq, then read
    every key in one read transaction and name that transaction's seq."""
    store = source.store
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FETCH_WAIT
    while store.last_seq() < f.min_seq and loop.time() < deadline:
        ev = asyncio.Event()
        source._waiters[ev] = None
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(0.05, max(0.0, deadline - loop.time()))):
                    await ev.wait()
        finally:
            source._waiters.pop(ev, None)
    if store.last_seq() < f.min_seq:
        out = Fetched(f.request, STATUS_BEHIND, store.last_seq(), [])
    else:
        try:
            # In a worker thread: large values must not hold the source's loop (on the
            # root it serves every writer too).
            out = Fetched(f.request, STATUS_READ, *await asyncio.to_thread(_read, source, f.keys))
        except CRCError as err:
            # Never a corrupt value, and never "absent" for one: the cache loses this
            # source (its misses answer 503 until it fails over).
            log.error("cache %s: %s; connection closed", link.address, err.message)
            link.abort()
            return
    if not link.closing():
        link.write(encode_fetched(out))


def _read(source: ReplicationSource, keys: Iterable[bytes]) -> tuple[int, list[Item]]:
    items: list[Item] = []
    size = 0
    with source.store.reader() as r:
        for k in keys:
            if items and size >= FETCH_BYTES:
                break  # the cache asks again for the rest
            v = r.get(k)
            items.append(Item(None, 0) if v is None else Item(v.value, v.seq))
            size += 0 if v is None else len(v.value)
        return r.seq(), items
