"""`GET /v1/watch?prefix=P&from_seq=N`: the changes under P as an NDJSON stream.

One line per change, ``{"seq", "op": "set"|"delete", "key"|"key_b64", "value"|"value_b64"}``
for every change under P with seq >= N (`from_seq` is inclusive, as the SDK's resumption
assumes), then ``{"heartbeat": true, "seq": S}`` lines meaning "every change up to S was
sent". A `from_seq` older than the retained log is a 410 before the stream starts.

One `WatchHub` per process reads the log for all watchers: it wakes on commit
notifications (same-process commits and the cross-process pings of `replicator.notify`),
reads each new log slice once in a worker thread, encodes each change once, and hands each
watcher only the lines under its prefix (one joined chunk per distinct prefix). A watcher
that starts behind the hub first catches up by itself, a step at a time (`catchup_step`,
in a worker thread, over records the catch-ups of the process share), each step only once
its socket took the last, then joins the hub exactly where the hub is: whatever `from_seq`
asks, a client that reads nothing holds two steps. Each watcher has a bounded queue; one
that falls too far behind gets a final ``{"error", "resume_from_seq"}`` line and is cut off
rather than buffered without bound, so a slow consumer costs the others nothing.

Streams have a budget of their own (`net.budget.Budget`, ``--watch-max-streams``): a watch
leaves the HTTP listener's connection budget when its stream starts
(`net.http_bounds.streaming`), and at the streams' cap a new one ends the stream whose
client has taken nothing for longest (`Watcher` is the budget's member).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import collections
import contextlib
import gc
import logging
import math
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
import snappy
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response, StreamingResponse

from core import ttl
from core.errors import CorruptionError, CRCError, InvalidReadError, LogRetentionError
from net import http_bounds
from net.budget import ANONYMOUS, Budget, Principal, Reason
from net.metrics import budget_hooks
from reads import jsonkv, keyspaces
from reads.metrics import WATCH_CATCHUPS, WATCH_ENDED, WATCH_RECORD_BYTES, WATCH_STREAMS
from reads.problems import problem
from replicator import heap
from replicator.notify import WakeListener
from store import codec, filtered
from store.format import (
    ENTRY_HEADER,
    MAX_KEY,
    OP_DELETE,
    OP_EXPIRE,
    OP_SET,
    OP_SET_EXPIRING,
    split_expiring,
)
from store.store import Store

NDJSON = "application/x-ndjson"
#: Seconds between heartbeat lines on an idle stream.
HEARTBEAT_S = 5.0
#: Longest wait for a commit notification before the hub looks at the log anyway (a lost
#: ping) and checks whether the server is stopping.
POLL_S = 0.5
#: The largest seq a log can hold (u64): a `from_seq` beyond it could never be reached.
MAX_SEQ = (1 << 64) - 1
#: Log records and bytes read per slice (the hub's and each catching-up watcher's).
SLICE_RECORDS = 256
SLICE_BYTES = 4 << 20
#: A watcher's queue bound: bytes and chunks not yet handed to its socket.
QUEUE_BYTES = 4 << 20
QUEUE_CHUNKS = 4096
#: Bytes of lines one catch-up step makes (at least one line): a catching-up watcher holds
#: at most this in its socket's buffer plus this waiting to go in (module docstring).
CATCHUP_STEP_BYTES = 256 << 10
#: Catch-up steps running at once in a process (each may decompress one log record).
CATCHUP_STEPS = 2
#: Decompressed log records the catch-ups of a process share (plus the newest one).
RECORD_CACHE_BYTES = 64 << 20
#: Seconds after the last catch-up ended before their memory is let go (`_release`): the
#: streams of a burst end together, one release serves them all.
RELEASE_DELAY_S = 1.0
#: Seconds between two releases at least (each collects the process's garbage, some tens
#: of ms on the loop): streams that end one by one cost one every so often, not each.
RELEASE_EVERY_S = 30.0
#: Concurrent watch streams per process; more are refused with 503.
MAX_WATCHERS = 10_000
#: Seconds a cut-off watcher gets to take its final line before its stream is cancelled
#: (a peer that reads nothing would otherwise hold its connection for ever).
CUTOFF_GRACE_S = 10.0

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Line:
    """One change as its NDJSON line."""

    seq: int
    key: bytes
    line: bytes


#: The user changes a watch stream shows (op 3, replicated documents, never touches a key).
USER_OPS = (OP_SET, OP_DELETE, OP_SET_EXPIRING, OP_EXPIRE)
_OP_NAMES = {OP_SET: "set", OP_DELETE: "delete", OP_SET_EXPIRING: "set", OP_EXPIRE: "expire"}


def change_line(seq: int, op: int, key: bytes, value: bytes) -> bytes:
    """The NDJSON line of one change (binary-safe: ``_b64`` names for non-UTF-8 bytes): a
    set (with ``expires_at`` when it has a deadline), a delete, or an expiry (``"op":
    "expire"``, the root's removal of a key whose deadline passed: not a producer's delete)."""
    doc: dict[str, Any] = {"seq": seq, "op": _OP_NAMES[op]}
    jsonkv.put_bytes(doc, "key", key)
    if op == OP_SET_EXPIRING:
        deadline, value = split_expiring(value)
        jsonkv.put_bytes(doc, "value", value)
        doc["expires_at"] = ttl.rfc3339(deadline)
    elif op == OP_SET:
        jsonkv.put_bytes(doc, "value", value)
    return orjson.dumps(doc) + b"\n"


def heartbeat_line(seq: int) -> bytes:
    """``{"heartbeat": true, "seq": seq}``: every change up to `seq` was sent."""
    return orjson.dumps({"heartbeat": True, "seq": seq}) + b"\n"


def read_slice(store: Store, from_seq: int) -> tuple[list[Line], int]:
    """The user changes with seq >= `from_seq` in one bounded slice of the log, and the
    seq after the slice (`from_seq` when the log holds nothing from there). Blocking:
    call it in a worker thread. Raises LogRetentionError when `from_seq` was collected."""
    recs = store.read_log(from_seq, max_records=SLICE_RECORDS, max_bytes=SLICE_BYTES)
    out: list[Line] = []
    nxt = from_seq
    for rec in recs:
        # The chain was checked when the record was applied: decode only, not hash every
        # byte again in the process that serves reads.
        raw = filtered.entries_of(rec.header, snappy.decompress(rec.payload))
        entries = codec.decode_entries(raw)
        for e in entries:
            # Op 3 (replicated documents) never touches user keys: not a change to watch.
            if e.seq >= from_seq and e.op in USER_OPS:
                out.append(Line(e.seq, e.key, change_line(e.seq, e.op, e.key, e.value)))
        nxt = max(nxt, rec.first_seq + rec.num_entries)
    return out, nxt


def group(lines: list[Line], prefixes: list[bytes]) -> dict[bytes, tuple[int, bytes]]:
    """For each prefix, the seq of the first change under it and the joined lines of all
    of them (absent when none)."""
    out: dict[bytes, tuple[int, bytes]] = {}
    for p in prefixes:
        mine = [x for x in lines if x.key.startswith(p)]
        if mine:
            out[p] = (mine[0].seq, b"".join(x.line for x in mine))
    return out


@dataclass(frozen=True, slots=True)
class Decoded:
    """One log record decompressed, with where each of its entries starts (entry i holds
    seq `first + i`: a record's seqs are consecutive)."""

    first: int
    count: int
    payload: bytes
    offsets: array.array[int]

    @property
    def size(self) -> int:
        return len(self.payload) + 8 * len(self.offsets)


def decode_record(first: int, count: int, compressed: bytes) -> Decoded:
    """`compressed` (a record's payload) decompressed, its entries located."""
    payload = snappy.decompress(compressed)
    offsets = array.array("Q")
    pos, n, hs = 0, len(payload), ENTRY_HEADER.size
    while pos < n:
        if pos + hs > n:
            raise CorruptionError(f"log record at seq {first}: truncated entry header")
        _seq, _op, on, kn, vn = ENTRY_HEADER.unpack_from(payload, pos)
        offsets.append(pos)
        pos += hs + on + kn + vn
    if pos != n or len(offsets) != count:
        raise CorruptionError(f"log record at seq {first}: entries do not match its header")
    return Decoded(first, count, payload, offsets)


class RecordCache:
    """The records a process's catch-ups decompressed last, shared (thread-safe), at most
    `max_bytes` of them plus the newest one. Catch-ups from an old seq read the same
    records (an attack opens hundreds from seq 1), and one catch-up takes a big record a
    step at a time: each step finds it here instead of decompressing it again."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._recs: collections.OrderedDict[int, Decoded] = collections.OrderedDict()
        self._size = 0

    def find(self, seq: int) -> Decoded | None:
        with self._lock:
            for d in reversed(self._recs.values()):
                if d.first <= seq < d.first + d.count:
                    self._recs.move_to_end(d.first)
                    return d
        return None

    def add(self, d: Decoded) -> None:
        with self._lock:
            if d.first in self._recs:
                return
            self._recs[d.first] = d
            self._size += d.size
            # Always keep the newest (a record over the bound is still taken step by step).
            while self._size > self.max_bytes and len(self._recs) > 1:
                _, old = self._recs.popitem(last=False)
                self._size -= old.size

    def clear(self) -> None:
        with self._lock:
            self._recs.clear()
            self._size = 0

    @property
    def size(self) -> int:
        """Bytes held now."""
        return self._size


def catchup_step(
    store: Store,
    cache: RecordCache,
    pos: int,
    limit: int,
    prefix: bytes,
    max_bytes: int,
) -> tuple[bytes, int]:
    """One step of a catch-up: the lines of the changes under `prefix` with `pos` <= seq <
    `limit`, from `pos` on, until they reach `max_bytes` (at least one line, however big)
    or SLICE_RECORDS records were looked at; and the seq to go on from. Blocking: call it
    in a worker thread. Raises LogRetentionError when `pos` was collected.

    Only what the step returns is new memory of the watcher's: the records come from the
    process's `cache` (read from the store one at a time when missing), and a line is built
    only for a change under the prefix, so a catch-up from any seq holds at most one step
    of lines whatever the log holds after it."""
    out: list[bytes] = []
    size = 0
    hs = ENTRY_HEADER.size
    for _ in range(SLICE_RECORDS):
        if pos >= limit or size >= max_bytes:
            break
        d = cache.find(pos)
        if d is None:
            recs = store.read_log(pos, max_records=1, max_bytes=1)
            if not recs or recs[0].last_seq < pos:
                break  # the log holds nothing there (yet)
            rec = recs[0]
            d = decode_record(rec.first_seq, rec.num_entries, rec.payload)
            del recs, rec
            cache.add(d)
        payload, offsets = d.payload, d.offsets
        end = min(d.first + d.count, limit)
        while pos < end and size < max_bytes:
            at = offsets[pos - d.first]
            seq, op, on, kn, vn = ENTRY_HEADER.unpack_from(payload, at)
            if seq != pos:
                raise CorruptionError(f"log record at seq {d.first}: entry {seq} at {pos}")
            k = at + hs + on
            # Op 3 (replicated documents) never touches user keys: not a change to watch.
            if op in USER_OPS and payload.startswith(prefix, k, k + kn):
                line = change_line(seq, op, payload[k : k + kn], payload[k + kn : k + kn + vn])
                out.append(line)
                size += len(line)
            pos += 1
    return b"".join(out), pos


class Watcher:
    """One stream's bounded queue of chunks (filled by the hub, drained by the stream).
    Each chunk is queued with the first seq it does not cover for sure: its first change's,
    or a heartbeat's seq + 1 (every change up to that seq came before it).

    Also the stream as its budget sees it (`net.budget.Member`): never idle (its answer is
    in progress); stalled since its client last took a byte (`progress_at`: when its last
    line was handed to the socket, which waits while the client takes nothing), so a full
    budget evicts the stream stuck longest, never one whose client keeps up; `conn` is its
    connection (None in-process)."""

    __slots__ = (
        "chunks",
        "conn",
        "event",
        "evicted",
        "final",
        "prefix",
        "progress_at",
        "resume",
        "size",
        "task",
    )

    def __init__(self, prefix: bytes, conn: Any = None) -> None:
        self.prefix = prefix
        self.conn = conn
        self.chunks: collections.deque[tuple[int, bytes]] = collections.deque()
        self.size = 0
        self.event = asyncio.Event()
        #: Set when the stream must end: its last line.
        self.final: bytes | None = None
        self.task: asyncio.Task[Any] | None = None
        self.progress_at = time.monotonic()
        #: The first seq it has not handed to its socket for sure (its client's resume).
        self.resume = 0
        #: Set by `evict`: the hub ends it (`WatchHub._evicted`).
        self.evicted: Callable[[Watcher], None] | None = None

    # --- net.budget.Member -------------------------------------------------------------

    def idle_since(self) -> float | None:
        return None

    def stalled_since(self) -> float | None:
        return self.progress_at

    def gone(self) -> bool:
        t = None if self.conn is None else self.conn.transport
        return t is not None and t.is_closing()

    def evict(self) -> None:
        if self.evicted is not None:
            self.evicted(self)


class WatchHub:
    """The one log reader of a process, fanning new changes out to every watcher."""

    def __init__(
        self,
        store: Store,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        queue_bytes: int = QUEUE_BYTES,
        queue_chunks: int = QUEUE_CHUNKS,
        max_watchers: int = MAX_WATCHERS,
        principal_share: float = 1.0,
        cutoff_grace_s: float = CUTOFF_GRACE_S,
        catchup_step_bytes: int = CATCHUP_STEP_BYTES,
        catchup_steps: int = CATCHUP_STEPS,
        record_cache_bytes: int = RECORD_CACHE_BYTES,
    ) -> None:
        self.store = store
        self.catchup_step_bytes = catchup_step_bytes
        #: Catch-up steps in flight at once (the memory of their records is bounded by it).
        self._steps = asyncio.Semaphore(catchup_steps)
        self.records = RecordCache(record_cache_bytes)
        #: Catch-ups in progress: when the last ends, their memory goes (`_release`).
        self.catching_up = 0
        self._steps_running = 0
        self._release_timer: asyncio.TimerHandle | None = None
        self._released_at = -math.inf
        self.heartbeat_s = heartbeat_s
        self.queue_bytes = queue_bytes
        self.queue_chunks = queue_chunks
        self.max_watchers = max_watchers
        count, sized = budget_hooks("watch", max_watchers, self._counted)
        #: The streams (`net.budget`): a budget of their own, never the requests'
        #: (`net.http_bounds.streaming`). Full, a newcomer evicts the stream whose client
        #: has taken nothing for longest (unauthenticated first, over-share principals
        #: first); every stream may be evicted (its client resumes from the seq its last
        #: line names).
        self.streams: Budget[Watcher] = Budget(
            max_watchers, count, on_size=sized, stalled_body=0.0, share=principal_share
        )
        self.cutoff_grace_s = cutoff_grace_s
        #: True once the server is stopping: every stream ends (see `end_streams_when`).
        self.closing: Callable[[], bool] = lambda: False
        #: The next seq the hub reads; everything before it was handed to the watchers.
        self.next_seq = 0
        self._groups: dict[bytes, set[Watcher]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._listener: WakeListener | None = None
        self.cut_off = 0

    # --- lifecycle (lazy: the first watch request starts the hub) ---------------------

    def _ensure_started(self) -> None:
        if self._task is not None:
            return
        loop = asyncio.get_running_loop()
        wake = self._wake = asyncio.Event()
        self.next_seq = self.store.last_seq() + 1

        def on_commit(_seq: int) -> None:
            # Runs in the committing thread, which must never fail for us: after the loop
            # closed (process exit) there is simply no one left to wake.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(wake.set)

        # Commits of this process (the root) call back in the commit thread...
        self.store.add_commit_listener(on_commit)
        # ... those of another process (a replica's worker) ping a datagram socket.
        self._listener = WakeListener(self.store.path, wake.set)
        self._listener.start()
        self._task = loop.create_task(self._run(), name="watch-hub")

    async def stop(self) -> None:
        """End every stream and the hub's task (tests; a process may just exit)."""
        self.closing = lambda: True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._end_all(b'{"error": "the node is stopping"}\n', "stopping")
        if self._listener is not None:
            self._listener.stop()

    # --- the pump ----------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._wake is not None
        next_heartbeat = time.monotonic() + self.heartbeat_s
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()
            if self.closing():
                self._end_all(b'{"error": "the node is stopping"}\n', "stopping")
                continue
            try:
                await self._pump()
            except Exception:  # a bug or a corrupt record: never a silent gap
                log.exception("watch hub failed to read the log at seq %d", self.next_seq)
                self._end_all(
                    orjson.dumps(
                        {
                            "error": "this node failed to read its log",
                            "resume_from_seq": self.next_seq,
                        }
                    )
                    + b"\n",
                    "log",
                )
                self.next_seq = self.store.last_seq() + 1
            now = time.monotonic()
            if now >= next_heartbeat:
                self._heartbeat()
                next_heartbeat = now + self.heartbeat_s

    async def _pump(self) -> None:
        """Read and hand out everything committed since the last pass, slice by slice."""
        while True:
            head = self.store.last_seq()
            if head < self.next_seq:
                return
            if not self._groups:  # nobody listens: nothing to read
                self.next_seq = head + 1
                return
            prefixes = list(self._groups)
            start = self.next_seq

            def work(start: int = start, prefixes: list[bytes] = prefixes) -> Any:
                lines, nxt = read_slice(self.store, start)
                return lines, nxt, group(lines, prefixes)

            try:
                lines, nxt, chunks = await asyncio.to_thread(work)
            except (LogRetentionError, CRCError, CorruptionError) as err:
                # The hub itself fell behind retention (or met a bad record): every
                # watcher must re-read; nothing is skipped silently.
                self._end_all(
                    orjson.dumps({"error": str(err), "resume_from_seq": start}) + b"\n", "log"
                )
                self.next_seq = head + 1
                return
            if nxt <= start:
                return  # the log holds nothing there yet (a commit between two reads)
            for prefix, group_ in list(self._groups.items()):
                if prefix in chunks:
                    chunk: tuple[int, bytes] | None = chunks[prefix]
                elif prefix in prefixes:
                    chunk = None
                else:  # a watcher with a new prefix joined while the slice was read
                    chunk = group(lines, [prefix]).get(prefix)
                if chunk:
                    for w in list(group_):
                        self._push(w, *chunk)
            self.next_seq = nxt

    def _push(self, w: Watcher, first_seq: int, chunk: bytes) -> None:
        # Into an empty queue a chunk always goes, whatever its size: one change's line may
        # be bigger than the bound (a 25 MiB value), and a watcher that takes everything
        # it is sent must not be cut off for it.
        if w.chunks and (
            w.size + len(chunk) > self.queue_bytes or len(w.chunks) >= self.queue_chunks
        ):
            resume = self._resume_seq(w, first_seq)
            self._cut(
                w,
                orjson.dumps(
                    {
                        "error": "this watcher fell too far behind and was disconnected",
                        "resume_from_seq": resume,
                    }
                )
                + b"\n",
            )
            return
        w.chunks.append((first_seq, chunk))
        w.size += len(chunk)
        w.event.set()

    @staticmethod
    def _resume_seq(w: Watcher, refused: int) -> int:
        """The first seq a cut-off watcher may not have been sent: that of its oldest queued
        chunk, or of the chunk refused when none is queued."""
        return w.chunks[0][0] if w.chunks else refused

    def _heartbeat(self) -> None:
        line = heartbeat_line(self.next_seq - 1)
        for group_ in self._groups.values():
            for w in group_:
                if not w.chunks:  # a stream with data pending needs no heartbeat
                    w.chunks.append((self.next_seq, line))
                    w.size += len(line)
                    w.event.set()

    def _cut(self, w: Watcher, final: bytes) -> None:
        self._unregister(w)
        self.cut_off += 1
        WATCH_ENDED.labels("slow").inc()
        w.chunks.clear()
        w.size = 0
        w.final = final
        w.event.set()
        task = w.task
        if task is not None:
            # A peer that reads nothing keeps its stream blocked in a send: end it.
            asyncio.get_running_loop().call_later(self.cutoff_grace_s, task.cancel)

    def _end_all(self, final: bytes, reason: str) -> None:
        for group_ in list(self._groups.values()):
            for w in list(group_):
                WATCH_ENDED.labels(reason).inc()
                self._unregister(w)
                w.final = final
                w.event.set()

    def _register(self, w: Watcher) -> None:
        self._groups.setdefault(w.prefix, set()).add(w)

    def _unregister(self, w: Watcher) -> None:
        g = self._groups.get(w.prefix)
        if g is not None:
            g.discard(w)
            if not g:
                del self._groups[w.prefix]

    # --- one stream --------------------------------------------------------------------

    def admit(self, from_seq: int | None) -> int:
        """The first seq a new stream sends (now when `from_seq` is None); raises
        LogRetentionError when that history is gone."""
        self._ensure_started()
        if from_seq is None:
            start = self.next_seq
        else:
            start = max(from_seq, 1)
            first, _ = self.store.log_bounds()
            if start < first:
                raise LogRetentionError(
                    f"seq {from_seq} is no longer retained (the log starts at {first})",
                    seq=from_seq,
                )
        return start

    def join(self, w: Watcher, start: int, principal: Principal = ANONYMOUS) -> bool:
        """Admit `w` (to stream from `start`) to the streams' budget for `principal`,
        ending another stream if the budget is full; False: none may be ended for it."""
        w.resume = start
        w.evicted = self._evicted
        return self.streams.admit(w, principal)

    @staticmethod
    def _counted(reason: Reason) -> None:
        if reason in (Reason.EVICTED, Reason.SHARE):
            WATCH_ENDED.labels("evicted").inc()

    def _evicted(self, w: Watcher) -> None:
        """End `w` for a newcomer (it left the budget): a last line naming where to resume
        when its client takes bytes; when its client takes nothing, its connection is
        dropped at once (the line could never reach it, and the slot is wanted now)."""
        self._unregister(w)
        w.chunks.clear()
        w.size = 0
        w.final = (
            orjson.dumps(
                {
                    "error": "this watch was ended to make room for another "
                    "(the node's watch streams are at their cap)",
                    "resume_from_seq": w.resume,
                }
            )
            + b"\n"
        )
        w.event.set()
        conn = w.conn
        if conn is None:
            return  # in-process (tests): no connection to hold
        if conn.write_paused() or conn.transport.is_closing():
            conn.transport.abort()
        elif w.task is not None:
            # One that takes its last line ends at once; else its grace runs out.
            asyncio.get_running_loop().call_later(self.cutoff_grace_s, w.task.cancel)

    async def _step(self, pos: int, limit: int, prefix: bytes) -> tuple[bytes, int]:
        """`catchup_step` in a worker thread, at most `catchup_steps` at once. A step runs
        to its end even when its stream is cancelled meanwhile (a thread cannot be
        stopped): it keeps its place among the steps until then, and the last to end
        lets the records go."""
        await self._steps.acquire()
        self._steps_running += 1
        fut = asyncio.get_running_loop().run_in_executor(
            None,
            catchup_step,
            self.store,
            self.records,
            pos,
            limit,
            prefix,
            self.catchup_step_bytes,
        )

        def done(f: asyncio.Future[tuple[bytes, int]]) -> None:
            self._steps.release()
            self._steps_running -= 1
            if not f.cancelled():
                f.exception()  # retrieved: a cancelled stream no longer awaits it
            self._release_if_idle()

        fut.add_done_callback(done)
        return await asyncio.shield(fut)

    def _release_if_idle(self) -> None:
        """A stream ended: with no catch-up left, let the memory of the ended ones go soon
        (`_release`), at most every `RELEASE_EVERY_S`."""
        if self.catching_up or self._steps_running or self._release_timer is not None:
            return
        wait = max(RELEASE_DELAY_S, self._released_at + RELEASE_EVERY_S - time.monotonic())
        with contextlib.suppress(RuntimeError):  # the loop is closing
            self._release_timer = asyncio.get_running_loop().call_later(wait, self._release)

    def _release(self) -> None:
        """The memory of the catch-ups, back to the system once none runs: the shared
        records go; the streams' garbage is collected (a stream that ends on its client's
        disconnect leaves reference cycles through its exception's traceback, which hold
        its last step's lines until a collection, and an idle server may not run one for
        hours); then what the steps freed in the worker threads' heaps is handed back
        (glibc keeps it there otherwise, and the process would keep the peak of a burst of
        catch-ups for ever)."""
        self._release_timer = None
        if self.catching_up or self._steps_running:
            return  # the last to end asks again
        self._released_at = time.monotonic()
        self.records.clear()
        t0 = time.perf_counter()
        found = gc.collect()
        log.debug("watch: %d objects collected in %.1f ms", found, (time.perf_counter() - t0) * 1e3)
        with contextlib.suppress(RuntimeError):  # the loop is closing
            asyncio.get_running_loop().run_in_executor(None, heap.release_free_memory)

    async def stream(
        self, prefix: bytes, start: int, w: Watcher | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The NDJSON of one watcher: the history from `start` up to the hub, read in
        bounded steps in a worker thread, then the hub's live chunks and heartbeats. `w`:
        its watcher, admitted to the streams' budget (`admit`); it leaves it here."""
        WATCH_STREAMS.inc()
        if w is None:
            w = Watcher(prefix)
            w.resume = start
        w.task = asyncio.current_task()
        try:
            # A replica behind the asked seq: wait until it has applied up to there, with
            # heartbeats meanwhile (a silent stream reads as a dead link to its client).
            # Their seq is start - 1: every change of what was asked (>= start) up to
            # there was sent, vacuously, and a resume asks for `start` again.
            quiet_since = time.monotonic()
            while self.next_seq < start and not self.closing() and w.final is None:
                if time.monotonic() - quiet_since >= self.heartbeat_s:
                    yield heartbeat_line(start - 1)
                    w.progress_at = quiet_since = time.monotonic()
                await asyncio.sleep(POLL_S)
            # The history, a step at a time, each step only once the last was handed to
            # the socket (the ASGI server's send waits while the client takes nothing):
            # a watcher that reads nothing holds at most two steps, whatever it asked for.
            pos = start
            self.catching_up += 1
            try:
                while pos < self.next_seq:
                    if w.final is not None:  # evicted meanwhile
                        yield w.final
                        return
                    # Only what the hub has already handed out: the rest comes from it.
                    limit = self.next_seq
                    try:
                        chunk, nxt = await self._step(pos, limit, prefix)
                    except (LogRetentionError, CRCError, CorruptionError) as err:
                        yield orjson.dumps({"error": str(err), "resume_from_seq": pos}) + b"\n"
                        return
                    if chunk:
                        yield chunk
                        del chunk
                        w.progress_at = time.monotonic()  # its client took bytes
                    pos = w.resume = nxt if nxt > pos else limit
            finally:
                self.catching_up -= 1
                self._release_if_idle()
            if w.final is not None:  # evicted during its last step
                yield w.final
                return
            # pos == next_seq here, with no await since the check: join the hub.
            self._register(w)
            yield heartbeat_line(self.next_seq - 1)
            w.progress_at = time.monotonic()
            while True:
                await w.event.wait()
                w.event.clear()
                while w.chunks:
                    seq, chunk = w.chunks.popleft()
                    w.size -= len(chunk)
                    w.resume = seq
                    yield chunk
                    w.progress_at = time.monotonic()
                    # Handed to the socket: the next unsent is the next chunk's, or, with
                    # none queued, whatever the hub hands out next.
                    w.resume = w.chunks[0][0] if w.chunks else self.next_seq
                if w.final is not None:
                    yield w.final
                    return
        finally:
            self._unregister(w)
            self.streams.leave(w)
            WATCH_STREAMS.dec()
            self._release_if_idle()


def _query(qs: bytes) -> dict[str, bytes]:
    return {
        k: v.encode("latin-1")
        for k, v in parse_qsl(qs.decode("latin-1"), keep_blank_values=True, encoding="latin-1")
    }


router = APIRouter()


# Not in the OpenAPI schema: an endless stream is no request a schema-driven client (or
# fuzzer) can complete; the contract is docs/api.md.
@router.get("/v1/watch", include_in_schema=False)
async def watch(request: Request) -> Response:
    """Changes under `prefix` with seq >= `from_seq` (omitted: from now on), as NDJSON."""
    hub: WatchHub = request.app.state.watch_hub
    q = _query(request.scope["query_string"])
    prefix = q.get("prefix", b"")
    if len(prefix) > MAX_KEY:
        raise InvalidReadError(f"prefix must be at most {MAX_KEY} bytes")
    keyspaces.check_prefixes([prefix])  # a filtered replica's: 421 outside its keyspaces
    raw = q.get("from_seq")
    try:
        from_seq = int(raw) if raw not in (None, b"") else None
    except ValueError as err:
        raise InvalidReadError("from_seq must be an integer") from err
    if from_seq is not None and not 0 <= from_seq <= MAX_SEQ:
        raise InvalidReadError(f"from_seq must be 0 to {MAX_SEQ} (seqs are 64-bit)")
    if hub.closing():
        return problem(503, "stopping", "this node is stopping", title="Node stopping")
    try:
        start = hub.admit(from_seq)
    except LogRetentionError as err:
        first, _ = hub.store.log_bounds()
        return problem(
            410,
            "log-gone",
            # The seq must be read BEFORE the range: a range page's X-Mercury-Seq is read
            # after its transaction, so watching from it could skip a change in between.
            f"{err.message}: note this node's seq S (GET /v1/status), re-read the keys "
            f"with GET /v1/range?prefix=..., then watch with from_seq = S + 1 (changes the "
            f"read already holds come again, in order); the SDK's Client.follow does this",
            title="Watch history no longer retained",
            log_first_seq=first,
        )
    # The connection leaves the listener's connection budget for the streams' (a stream
    # never holds a slot requests need); its answer is the last on it (`connection:
    # close`), so it never serves requests again outside the connection budget.
    seat = http_bounds.streaming(request.scope)
    conn, principal = seat if seat is not None else (None, ANONYMOUS)
    w = Watcher(prefix, conn)
    if not hub.join(w, start, principal):
        response = problem(
            503,
            "too-many-watchers",
            f"this node serves at most {hub.max_watchers} watch streams and none may be "
            "ended for this one",
            title="Too many watchers",
            hint="retry later or watch another replica",
        )
        response.headers["Retry-After"] = "5"
        response.headers["Connection"] = "close"
        return response
    return StreamingResponse(
        hub.stream(prefix, start, w),
        media_type=NDJSON,
        headers={"Cache-Control": "no-store", "Connection": "close"},
    )


@dataclass(frozen=True, slots=True)
class WatchLimits:
    """A process's bounds on watch streams (the ``--watch-*`` flags): `max_streams`, its
    budget of streams; `queue_bytes`, each stream's queue of live changes not yet handed
    to its socket; `principal_share`, the part of a full budget one principal may hold
    (``--http-principal-share``, the connections' share)."""

    max_streams: int = MAX_WATCHERS
    queue_bytes: int = QUEUE_BYTES
    principal_share: float = 1.0

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WatchLimits:
        return cls(
            max_streams=int(args.watch_max_streams),
            queue_bytes=int(args.watch_queue_bytes),
            principal_share=float(getattr(args, "http_principal_share", 1.0)),
        )


#: This process's watch bounds (`set_limits`; what `install` builds a hub with).
LIMITS = WatchLimits()


def set_limits(limits: WatchLimits) -> None:
    """The bounds of the hubs `install` builds from now on (the wiring, from the flags)."""
    global LIMITS
    LIMITS = limits


def add_flags(p: argparse.ArgumentParser) -> None:
    """The ``--watch-*`` flags of `mercury root`, `mercury replica` and `python -m
    mercury.readserve`."""
    d = WatchLimits()
    p.add_argument(
        "--watch-max-streams",
        type=int,
        default=d.max_streams,
        metavar="N",
        help="watch streams at most (per process), a budget of their own beside the HTTP "
        "connections' (a stream never takes a connection slot); when full, a new watch "
        "ends the stream whose client has taken nothing for longest (unauthenticated "
        "first); one principal may hold --http-principal-share of them "
        f"(default {d.max_streams})",
    )
    p.add_argument(
        "--watch-queue-bytes",
        type=int,
        default=d.queue_bytes,
        metavar="BYTES",
        help="live changes queued for one watch stream and not yet handed to its socket, at "
        "most; a stream over it is cut off with the seq to resume from "
        f"(default {d.queue_bytes})",
    )


def install(app: FastAPI, store: Store) -> WatchHub:
    """Serve `GET /v1/watch` on `app` from a hub over `store` (``app.state.watch_hub``),
    under this process's `LIMITS`."""
    hub = WatchHub(
        store,
        queue_bytes=LIMITS.queue_bytes,
        max_watchers=LIMITS.max_streams,
        principal_share=LIMITS.principal_share,
    )
    app.state.watch_hub = hub
    WATCH_CATCHUPS.set_function(lambda: hub.catching_up)
    WATCH_RECORD_BYTES.set_function(lambda: hub.records.size)
    app.include_router(router)
    return hub


def end_streams_when(app: FastAPI, closing: Callable[[], bool]) -> None:
    """Make `app`'s watch streams end once `closing()` is true (the server is stopping):
    uvicorn waits for every open response before it stops, and a watch never ends."""
    hub: WatchHub | None = getattr(app.state, "watch_hub", None)
    if hub is not None:
        hub.closing = closing
