"""`GET /v1/watch?prefix=P&from_seq=N`: the changes under P as an NDJSON stream.

One line per change, ``{"seq", "op": "set"|"delete", "key"|"key_b64", "value"|"value_b64"}``
for every change under P with seq >= N (`from_seq` is inclusive, as the SDK's resumption
assumes), then ``{"heartbeat": true, "seq": S}`` lines meaning "every change up to S was
sent". A `from_seq` older than the retained log is a 410 before the stream starts.

One `WatchHub` per process reads the log for all watchers: it wakes on commit
notifications (same-process commits and the cross-process pings of `replicator.notify`),
reads each new log slice once in a worker thread, encodes each change once, and hands each
watcher only the lines under its prefix (one joined chunk per distinct prefix). A watcher
that starts behind the hub first catches up by itself, in bounded slices read in a worker
thread, then joins the hub exactly where the hub is. Each watcher has a bounded queue; one
that falls too far behind gets a final ``{"error", "resume_from_seq"}`` line and is cut off
rather than buffered without bound, so a slow consumer costs the others nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

import orjson
import snappy
from fastapi import APIRouter, FastAPI, Request
from starlette.responses import Response, StreamingResponse

from core.errors import CorruptionError, CRCError, InvalidReadError, LogRetentionError
from reads import jsonkv
from reads.metrics import WATCH_ENDED, WATCH_STREAMS
from reads.problems import problem
from replicator.notify import WakeListener
from store import codec
from store.format import MAX_KEY, OP_DELETE, OP_SET
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


def change_line(seq: int, op: int, key: bytes, value: bytes) -> bytes:
    """The NDJSON line of one change (binary-safe: ``_b64`` names for non-UTF-8 bytes)."""
    doc: dict[str, Any] = {"seq": seq, "op": "set" if op == OP_SET else "delete"}
    jsonkv.put_bytes(doc, "key", key)
    if op == OP_SET:
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
        entries = codec.decode_entries(snappy.decompress(rec.payload))
        for e in entries:
            # Op 3 (replicated documents) never touches user keys: not a change to watch.
            if e.seq >= from_seq and e.op in (OP_SET, OP_DELETE):
                out.append(Line(e.seq, e.key, change_line(e.seq, e.op, e.key, e.value)))
        nxt = max(nxt, rec.first_seq + rec.num_entries)
    return out, nxt


def group(lines: list[Line], prefixes: list[bytes]) -> dict[bytes, bytes]:
    """For each prefix, the joined lines of the changes under it (absent when none)."""
    out: dict[bytes, bytes] = {}
    for p in prefixes:
        chunk = b"".join(x.line for x in lines if x.key.startswith(p))
        if chunk:
            out[p] = chunk
    return out


class Watcher:
    """One stream's bounded queue of chunks (filled by the hub, drained by the stream)."""

    __slots__ = ("chunks", "event", "final", "prefix", "size", "task")

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.chunks: collections.deque[bytes] = collections.deque()
        self.size = 0
        self.event = asyncio.Event()
        #: Set when the stream must end: its last line.
        self.final: bytes | None = None
        self.task: asyncio.Task[Any] | None = None


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
        cutoff_grace_s: float = CUTOFF_GRACE_S,
    ) -> None:
        self.store = store
        self.heartbeat_s = heartbeat_s
        self.queue_bytes = queue_bytes
        self.queue_chunks = queue_chunks
        self.max_watchers = max_watchers
        self.cutoff_grace_s = cutoff_grace_s
        #: True once the server is stopping: every stream ends (see `end_streams_when`).
        self.closing: Callable[[], bool] = lambda: False
        #: The next seq the hub reads; everything before it was handed to the watchers.
        self.next_seq = 0
        self._groups: dict[bytes, set[Watcher]] = {}
        self._count = 0
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
                    chunk: bytes | None = chunks[prefix]
                elif prefix in prefixes:
                    chunk = None
                else:  # a watcher with a new prefix joined while the slice was read
                    chunk = group(lines, [prefix]).get(prefix)
                if chunk:
                    for w in list(group_):
                        self._push(w, chunk)
            self.next_seq = nxt

    def _push(self, w: Watcher, chunk: bytes) -> None:
        if w.size + len(chunk) > self.queue_bytes or len(w.chunks) >= self.queue_chunks:
            resume = self._resume_seq(w)
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
        w.chunks.append(chunk)
        w.size += len(chunk)
        w.event.set()

    @staticmethod
    def _resume_seq(w: Watcher) -> int:
        """The first seq a cut-off watcher has not been sent: its oldest queued change."""
        if w.chunks:
            with contextlib.suppress(Exception):
                return int(orjson.loads(w.chunks[0].split(b"\n", 1)[0]).get("seq", 0))
        return 0

    def _heartbeat(self) -> None:
        line = heartbeat_line(self.next_seq - 1)
        for group_ in self._groups.values():
            for w in group_:
                if not w.chunks:  # a stream with data pending needs no heartbeat
                    w.chunks.append(line)
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
        LogRetentionError when that history is gone, OverflowError when full."""
        if self._count >= self.max_watchers:
            raise OverflowError
        self._ensure_started()
        if from_seq is None:
            return self.next_seq
        start = max(from_seq, 1)
        first, _ = self.store.log_bounds()
        if start < first:
            raise LogRetentionError(
                f"seq {from_seq} is no longer retained (the log starts at {first})", seq=from_seq
            )
        return start

    async def stream(self, prefix: bytes, start: int) -> AsyncGenerator[bytes, None]:
        """The NDJSON of one watcher: the history from `start` up to the hub, read in
        bounded slices in a worker thread, then the hub's live chunks and heartbeats."""
        self._count += 1
        WATCH_STREAMS.inc()
        w = Watcher(prefix)
        w.task = asyncio.current_task()
        try:
            # A replica behind the asked seq: wait until it has applied up to there, with
            # heartbeats meanwhile (a silent stream reads as a dead link to its client).
            # Their seq is start - 1: every change of what was asked (>= start) up to
            # there was sent, vacuously, and a resume asks for `start` again.
            quiet_since = time.monotonic()
            while self.next_seq < start and not self.closing():
                if time.monotonic() - quiet_since >= self.heartbeat_s:
                    yield heartbeat_line(start - 1)
                    quiet_since = time.monotonic()
                await asyncio.sleep(POLL_S)
            pos = start
            while pos < self.next_seq:
                try:
                    lines, nxt = await asyncio.to_thread(read_slice, self.store, pos)
                except (LogRetentionError, CRCError, CorruptionError) as err:
                    yield orjson.dumps({"error": str(err), "resume_from_seq": pos}) + b"\n"
                    return
                # Only what the hub has already handed out: the rest comes from the hub.
                limit = self.next_seq
                chunk = b"".join(
                    x.line for x in lines if x.seq < limit and x.key.startswith(prefix)
                )
                if chunk:
                    yield chunk
                pos = min(nxt, limit) if nxt > pos else limit
            # pos == next_seq here, with no await since the check: join the hub.
            self._register(w)
            yield heartbeat_line(self.next_seq - 1)
            while True:
                await w.event.wait()
                w.event.clear()
                while w.chunks:
                    chunk = w.chunks.popleft()
                    w.size -= len(chunk)
                    yield chunk
                if w.final is not None:
                    yield w.final
                    return
        finally:
            self._unregister(w)
            self._count -= 1
            WATCH_STREAMS.dec()


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
    except OverflowError:
        return problem(
            503,
            "too-many-watchers",
            f"this node serves at most {hub.max_watchers} watch streams",
            title="Too many watchers",
            hint="retry later or watch another replica",
        )
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
    return StreamingResponse(
        hub.stream(prefix, start),
        media_type=NDJSON,
        headers={"Cache-Control": "no-store"},
    )


def install(app: FastAPI, store: Store) -> WatchHub:
    """Serve `GET /v1/watch` on `app` from a hub over `store` (``app.state.watch_hub``)."""
    hub = WatchHub(store)
    app.state.watch_hub = hub
    app.include_router(router)
    return hub


def end_streams_when(app: FastAPI, closing: Callable[[], bool]) -> None:
    """Make `app`'s watch streams end once `closing()` is true (the server is stopping):
    uvicorn waits for every open response before it stops, and a watch never ends."""
    hub: WatchHub | None = getattr(app.state, "watch_hub", None)
    if hub is not None:
        hub.closing = closing
