"""Unused-key analytics on the root: the read ledger and the "unused keys" query.

Every node summarises the keys its readers served (`reads/readstats.py`: 8-byte key hashes
per UTC day); replicas send the summaries up the replication link (`replicator/upstream.py`,
kind READS, relayed by every tier), the root's own readers hand theirs over in-process.
The ledger keeps, per day, the set of key hashes read on any node, and persists each
hash once per day:

- ``usage/r/d/<YYYYMMDD>/<HHMMSS>-<n>``: the hashes first seen read that day since the
  previous document (sorted, 8 bytes each, at most `DOC_HASHES` per document). Written
  once, never rewritten: a day costs 8 bytes per distinct key read (+ names), and the
  log carries each hash once a day whatever the read rate.
- ``usage/r/meta``: when tracking began (``since``), one ``[time, seq]`` mark per day
  (the store's last seq at that time: keys at or below it were written before it, which
  dates keys whose write the retained log no longer holds), and the days on which some
  node's set overflowed (``lossy``: reads were dropped, an answer may list a key that was
  read).

These are replicated documents (a promoted root keeps them), written every `FLUSH_S`
seconds at most when something is pending, in a transaction of their own run in the
gateway's commit thread (serialised with batches): one commit a minute at most, never one
per read or per summary. A crash loses at most the last minute's new hashes.

A key is **unused for D days** when no node reported a read of it on any UTC day that
overlaps the last D days (day granularity: a read early today counts for a window of
an hour), and its value was written before the window began (a key written within the
window is too young to judge: "never read since written" counts after D days). Hash
collisions and day granularity can only hide an unused key, never list a read one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from core.errors import LogRetentionError
from store.store import Store
from store.usage import stored_bytes

log = logging.getLogger("mercury.gateway.usage_reads")

PREFIX = "usage/r/d/"
META = "usage/r/meta"
DOC_HASHES = 65536
FLUSH_S = 60.0
KEEP_DAYS = 92
#: Keys one query examines at most (the answer says where it stopped).
MAX_SCAN = 2_000_000
#: Key hashes are this long (`reads/readstats.py` makes them; the wiring hands them in, so
#: the gateway imports nothing of `reads`).
H = 8
KeyHash = Callable[[bytes], bytes]


def day_of(t: float) -> int:
    """UTC day number of epoch seconds `t`."""
    return int(t // 86400)


def ymd(day: int) -> str:
    """``YYYYMMDD`` of UTC day number `day`."""
    return f"{datetime.fromtimestamp(day * 86400, UTC):%Y%m%d}"


@dataclass
class Meta:
    """The ledger's own facts (document `usage/r/meta`)."""

    since: float = 0.0
    marks: list[tuple[float, int]] = field(default_factory=list)
    lossy: list[int] = field(default_factory=list)

    @classmethod
    def decode(cls, raw: bytes | None) -> Meta:
        if not raw:
            return cls()
        d = orjson.loads(raw)
        return cls(float(d["since"]), [(float(t), int(s)) for t, s in d["marks"]], list(d["lossy"]))

    def encode(self) -> bytes:
        return orjson.dumps(
            {"since": self.since, "marks": [list(m) for m in self.marks], "lossy": self.lossy}
        )


class ReadLedger:
    """Key hashes read per day on any node: merged in memory, persisted as documents.

    `add` runs on the event loop (a summary arrives), `flush` in the commit thread,
    `read_in` and the queries in worker threads; one lock guards the state.
    """

    def __init__(
        self, store: Store, key_hash: KeyHash, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        #: The same function the readers' summaries hash keys with.
        self.key_hash = key_hash
        self.clock = clock
        self._lock = threading.Lock()
        #: day -> hashes known read that day (loaded lazily from the documents + arrived).
        self._days: dict[int, set[bytes]] = {}
        self._pending: dict[int, set[bytes]] = {}
        self._n = 0
        doc = store.get_doc(META)
        self.meta = Meta.decode(doc.body if doc is not None else None)
        self._meta_dirty = False
        if not self.meta.since:
            self.meta.since = clock()
            self._meta_dirty = True
        self.summaries = 0
        #: Summaries of a day outside the kept ones.
        self.ignored = 0

    # --- merging ---------------------------------------------------------------------

    def add(self, day: int, dropped: int, hashes: Iterable[bytes]) -> None:
        """Merge one read summary: key hashes read on UTC day `day`, and how many reads
        the node could not record (its set was full). A day outside the kept ones (or
        more than a day ahead: a node's clock gone wrong) is ignored."""
        today = day_of(self.clock())
        if not today - KEEP_DAYS < day <= today + 1:
            self.ignored += 1
            return
        known = self._day(day)
        with self._lock:
            self.summaries += 1
            new = set(hashes) - known
            if new:
                known |= new
                self._pending.setdefault(day, set()).update(new)
            if dropped and day not in self.meta.lossy:
                self.meta.lossy.append(day)
                self._meta_dirty = True

    def _day(self, day: int) -> set[bytes]:
        """The hashes read on `day` (loaded from its documents on first use)."""
        with self._lock:
            got = self._days.get(day)
        if got is not None:
            return got
        loaded: set[bytes] = set()
        after = ""
        prefix = f"{PREFIX}{ymd(day)}/"
        while True:
            page = self.store.scan_docs(prefix, after=after, limit=256)
            for name, doc in page:
                b = doc.body
                loaded.update(b[i : i + H] for i in range(0, len(b), H))
                after = name
            if len(page) < 256:
                break
        with self._lock:
            return self._days.setdefault(day, loaded)

    def read_in(self, days: Iterable[int]) -> set[bytes]:
        """Hashes read on any of `days`."""
        sets = [self._day(d) for d in days]
        out: set[bytes] = set()
        with self._lock:  # `add` grows today's set on the event loop meanwhile
            for got in sets:
                out |= got
        return out

    # --- persisting ------------------------------------------------------------------

    def due(self) -> dict[str, bytes | None]:
        """The document changes to write now (taking the pending hashes)."""
        now = self.clock()
        today = day_of(now)
        with self._lock:
            pending, self._pending = self._pending, {}
            if not self.meta.marks or day_of(self.meta.marks[-1][0]) != today:
                self.meta.marks.append((now, self.store.last_seq()))
                self.meta.marks = self.meta.marks[-KEEP_DAYS:]
                self._meta_dirty = True
            oldest = today - KEEP_DAYS
            if any(d < oldest for d in self.meta.lossy):
                self.meta.lossy = [d for d in self.meta.lossy if d >= oldest]
                self._meta_dirty = True
            for d in [d for d in self._days if d < oldest]:
                del self._days[d]
            changes: dict[str, bytes | None] = {}
            if self._meta_dirty:
                changes[META] = self.meta.encode()
                self._meta_dirty = False
            stamp = datetime.fromtimestamp(now, UTC).strftime("%H%M%S")
            for day, hashes in sorted(pending.items()):
                ordered = sorted(hashes)
                for i in range(0, len(ordered), DOC_HASHES):
                    self._n += 1
                    name = f"{PREFIX}{ymd(day)}/{stamp}-{self._n:06d}"
                    changes[name] = b"".join(ordered[i : i + DOC_HASHES])
        changes.update(self._expired(today - KEEP_DAYS))
        return changes

    def _expired(self, oldest: int, limit: int = 256) -> dict[str, bytes | None]:
        """Deletions of the documents of days before `oldest` (the oldest few)."""
        cut = f"{PREFIX}{ymd(oldest)}"
        return {name: None for name, _ in self.store.scan_docs(PREFIX, limit=limit) if name < cut}

    def flush(self) -> int:
        """Write what is due in one transaction (call it in the commit thread); the number
        of documents written. On a failure the hashes stay pending."""
        changes = self.due()
        if not changes:
            return 0
        try:
            self.store.put_docs(changes)
        except Exception:
            with self._lock:
                for name, body in changes.items():
                    if body is not None and name.startswith(PREFIX):
                        day = _day_of_name(name)
                        self._pending.setdefault(day, set()).update(
                            body[i : i + H] for i in range(0, len(body), H)
                        )
                self._meta_dirty = True
            raise
        return len(changes)

    # --- answering -------------------------------------------------------------------

    def seq_before(self, t: float) -> int:
        """The newest seq committed at or before epoch seconds `t` (0 when unknown): from
        the retained log (binary search on its records' times), else from the day marks."""
        t_us = int(t * 1e6)
        store = self.store
        first, _ = store.log_bounds()
        last = store.last_seq()
        best = 0
        try:
            lo, hi = first, last
            head = store.read_log(first, max_records=1) if first <= last else []
            if head and head[0].time_us <= t_us:
                while lo <= hi:
                    rec = store.read_log((lo + hi) // 2, max_records=1)[0]
                    if rec.time_us <= t_us:
                        best = rec.last_seq
                        lo = rec.last_seq + 1
                    else:
                        hi = rec.first_seq - 1
                return best
        except (LogRetentionError, IndexError):
            pass  # collected meanwhile: the marks below
        for mt, ms in self.meta.marks:
            if mt <= t:
                best = max(best, ms)
        return best


@dataclass(frozen=True)
class Window:
    """What "unused for `days` days" means at `now`."""

    days: float
    now: float
    cutoff: float
    read_days: range
    cutoff_seq: int
    complete: bool


def window(ledger: ReadLedger, days: float) -> Window:
    """The days whose reads count and the seq a key must be at or below to be judged."""
    now = ledger.clock()
    cutoff = now - days * 86400
    read_days = range(day_of(cutoff), day_of(now) + 1)
    lossy = any(d in read_days for d in ledger.meta.lossy)
    complete = ledger.meta.since <= cutoff and not lossy
    return Window(days, now, cutoff, read_days, ledger.seq_before(cutoff), complete)


def unused_page(
    ledger: ReadLedger,
    prefixes: Sequence[bytes],
    w: Window,
    *,
    after: bytes | None,
    limit: int,
    max_scan: int = MAX_SCAN,
) -> dict[str, Any]:
    """One page of unused keys under `prefixes` (a producer's keyspaces), in key order
    after `after`: ``{"keys": [{"key"|"key_b64", "bytes", "version"}], "bytes", "next"}``
    (`next`: the cursor of the next page, or None). `scanned` counts keys examined."""
    read = ledger.read_in(w.read_days)
    out: list[dict[str, Any]] = []
    total = scanned = 0
    nxt: bytes | None = None
    key_hash = ledger.key_hash
    with ledger.store.reader() as r:
        for p in sorted(prefixes):
            if after is not None and after >= p and not after.startswith(p):
                continue  # this keyspace lies wholly before the cursor
            start = after + b"\x00" if after is not None and after.startswith(p) else p
            for k, v in r.scan(start=start, prefix=p):
                scanned += 1
                if v is not None and v.seq <= w.cutoff_seq and key_hash(k) not in read:
                    if len(out) == limit:
                        nxt = out[-1]["_k"]
                        break
                    n = stored_bytes(len(k), len(v.value), len(v.owner.encode()))
                    total += n
                    out.append({"_k": k, "bytes": n, "version": v.seq})
                if scanned >= max_scan:
                    nxt = k
                    break
            if nxt is not None:
                break
    for item in out:
        k = item.pop("_k")
        try:
            item["key"] = k.decode()
        except UnicodeDecodeError:
            item["key_b64"] = base64.b64encode(k).decode()
    return {"keys": out, "bytes": total, "scanned": scanned, "next": nxt}


def unused_totals(
    ledger: ReadLedger, prefixes: Sequence[bytes], w: Window, max_scan: int = MAX_SCAN
) -> dict[str, Any]:
    """Per keyspace prefix: keys, unused keys and the bytes they hold (a full scan, at most
    `max_scan` keys: ``truncated`` says when it stopped early)."""
    read = ledger.read_in(w.read_days)
    key_hash = ledger.key_hash
    rows: dict[bytes, dict[str, int]] = {}
    scanned = 0
    truncated = False
    with ledger.store.reader() as r:
        for p in sorted(prefixes):
            row = rows[p] = {"keys": 0, "unused_keys": 0, "unused_bytes": 0, "too_new": 0}
            for k, v in r.scan(prefix=p):
                if scanned >= max_scan:
                    truncated = True
                    break
                scanned += 1
                if v is None:
                    continue
                row["keys"] += 1
                if v.seq > w.cutoff_seq:
                    row["too_new"] += 1
                elif key_hash(k) not in read:
                    row["unused_keys"] += 1
                    row["unused_bytes"] += stored_bytes(len(k), len(v.value), len(v.owner.encode()))
    return {"rows": rows, "truncated": truncated}


def _day_of_name(name: str) -> int:
    d = datetime.strptime(name[len(PREFIX) : len(PREFIX) + 8], "%Y%m%d").replace(tzinfo=UTC)
    return int(d.timestamp() // 86400)


class LedgerService:
    """Flushes the ledger every `period` seconds in the gateway's commit thread (so its
    transaction is serialised with the batches), and once more at stop (after the gateway
    committed its last batch: nothing else writes then)."""

    name = "read-ledger"

    def __init__(
        self, ledger: ReadLedger, executor: Callable[[], Executor], period: float = FLUSH_S
    ) -> None:
        self.ledger = ledger
        self.executor = executor
        self.period = period
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Today's and yesterday's hashes now, in a thread: the first summary of a day
        # would otherwise load them on the event loop.
        today = day_of(self.ledger.clock())
        await asyncio.to_thread(self.ledger.read_in, [today - 1, today])
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await asyncio.to_thread(self.ledger.flush)
        except Exception:
            log.exception("read ledger: last flush failed")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.period)
            try:
                await loop.run_in_executor(self.executor(), self.ledger.flush)
            except Exception:
                log.exception("read ledger flush failed; retrying in %gs", self.period)
