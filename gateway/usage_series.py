"""Usage over time: per producer and keyspace, per minute, kept as replicated documents.

What is counted, per (producer, keyspace, minute): writes, bytes written (key + value of
each written set), deletes, duplicates, ops held by the rate quota, ops refused by it
(429), ops refused as never admissible (413), expiries (keys of the producer the root
expired: apart from deletes, and never a producer's op, so never counted by a quota —
`add_expiries`), and keys and stored bytes at the end of
the minute: per producer from the store's usage counters, per keyspace of a producer with
several from the store's per-keyspace figures (`Store.track_keyspaces`, told here which
producers those are). Quota outcomes are per producer: they are recorded under the
keyspace ``""`` ("not attributable to a keyspace") and so count in a producer's totals,
not in a single keyspace's.

Layout (documents in the store's replicated ``docs`` sub-database, written through the
log in a batch's own transaction, so every replica — and a promoted root — holds them):

- ``usage/m/<producer>/<YYYYMMDDHH><tens of minute>``: a 10-minute block of minute slots,
  ``{"t": block start (epoch s), "m": {keyspace: [[minute, writes, bytes_written, deletes,
  duplicates, held, refused_429, refused_413(, expiries)], ...]}, "s": [[minute, keys, bytes], ...],
  "k": {keyspace: [[minute, keys, bytes], ...]}}`` ("k" only for a producer with several
  keyspaces) with only the minutes that saw activity (minute = offset in the block, 0-9).
  A keyspace busy every minute costs about 82 kB a day (`bench/usage.py`); kept 31 days.
- ``usage/h/<producer>/<YYYYMMDD>``: one day of hour slots (the rollup), the same shape
  with hours 0-23 in place of minutes; kept a year.

When: a minute's counts stay in memory until it is over; the first batch committed after
that carries the changed block document in its transaction (no commit of its own, no
extra fsync). The day document takes a block's minutes once the block is over (so it is
rewritten once per block, not per minute: every rewrite goes through the log); until
then hourly queries read those minutes from memory. A crash loses at most the open
minute's counts (the open block's in the rollup), as the deferred duplicate counters:
statistics, never data. A clean stop writes everything (`due(..., all_=True)`).
Retention deletions ride the same way, at most once an hour.

This module is pure apart from the store reads it is handed (`load`): counting
(`add_results`, `add_quota`, `add_expiries`), folding into documents (`due`), and reading
a range back (`query`) for `GET /v1/usage/series`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import compress
from operator import itemgetter
from typing import Protocol, TypeVar

import orjson

from core import compiled
from store.ops import Op, Result, Status
from store.store import Store

#: The compiled per-request counting (`gateway/_usagecount.pyx`), or None where its pure
#: twin `_count_one_py` serves (`core/compiled.py`: ``MERCURY_PURE=1``, or before
#: `make build`).
_usagecount = compiled.load("gateway._usagecount")
_fast_count: (
    Callable[[list[Op], list[Result], object, object, object], tuple[int, int, int, int]] | None
) = None if _usagecount is None else _usagecount.count_one

#: Columns of one slot row after its index (minute or hour).
COLS = (
    "writes",
    "bytes_written",
    "deletes",
    "duplicates",
    "held",
    "refused_429",
    "refused_413",
    "expiries",
)
_W, _BW, _D, _DUP, _HELD, _R429, _R413, _EXP = range(len(COLS))
#: Columns a stored row always has: `expiries` came later and is written only when not
#: zero, so documents without expiries keep their size and older ones read as 0.
_STORED_MIN = _EXP
#: Quota outcomes (`gateway.admission.OUTCOMES`) -> column.
QUOTA_COL = {"held": _HELD, "refused": _R429, "too_large": _R413}

_K = TypeVar("_K")


def add_cols(rows: dict[_K, list[int]], key: _K, cols: Sequence[int]) -> None:
    """Add `cols` into the columns of `rows[key]` (zeros when there is none yet)."""
    cur = rows.setdefault(key, [0] * len(COLS))
    for j, v in enumerate(cols):
        cur[j] += v


MINUTE_KEEP_S = 31 * 86400
HOUR_KEEP_S = 366 * 86400
STEPS = {"1m": 60, "1h": 3600, "1d": 86400}
#: Seconds of minute slots in one document: a document is rewritten each time one of its
#: minutes closes, so the log carries about (slots + 1) / 2 x its final size per slot;
#: 10 keeps that small while a day still fits in 144 documents.
BLOCK = 600
MAX_POINTS = 5000


class Counted(Protocol):
    """What `UsageSeries.add_requests` reads of a batcher's request."""

    @property
    def producer(self) -> str: ...

    @property
    def ops(self) -> Sequence[Op]: ...


#: Reads one replicated document (name -> bytes or None).
LoadFn = Callable[[str], bytes | None]
#: Documents (name, bytes) under `prefix` whose names sort after `after` ("" for all), in
#: name order, at most `limit` of them (`Store.scan_docs`).
ListFn = Callable[[str, str, int], list[tuple[str, bytes]]]


def block_suffix(t: float) -> str:
    """``YYYYMMDDHH`` + the tens of the minute: the 10-minute block holding `t`."""
    d = datetime.fromtimestamp(t, UTC)
    return f"{d:%Y%m%d%H}{d.minute // 10}"


def day_suffix(t: float) -> str:
    """``YYYYMMDD`` of the day holding `t`."""
    return f"{datetime.fromtimestamp(t, UTC):%Y%m%d}"


def block_name(producer: str, t: int) -> str:
    """Name of the minute-slot document of `producer` for the 10-minute block of `t`."""
    return f"usage/m/{producer}/{block_suffix(t)}"


def day_name(producer: str, t: int) -> str:
    """Name of the hour-slot (rollup) document of `producer` for the day holding `t`."""
    return f"usage/h/{producer}/{day_suffix(t)}"


#: A producer's state at a slot's end: (keys, stored bytes, per keyspace (keys, bytes) when
#: it has several keyspaces, else None: then its one keyspace's are the first two).
State = tuple[int, int, dict[str, tuple[int, int]] | None]


@dataclass
class SlotDoc:
    """A block of minute slots or a day of hour slots, decoded."""

    t: int
    rows: dict[str, dict[int, list[int]]]  # keyspace -> slot -> columns
    snap: dict[int, State]  # slot -> state at the slot's end

    @classmethod
    def decode(cls, raw: bytes | None, t: int) -> SlotDoc:
        if not raw:
            return cls(t, {}, {})
        d = orjson.loads(raw)
        rows = {ks: {r[0]: _padded(r[1:]) for r in rs} for ks, rs in d.get("m", {}).items()}
        per_ks: dict[int, dict[str, tuple[int, int]]] = {}
        for ks, rs in d.get("k", {}).items():
            for r in rs:
                per_ks.setdefault(r[0], {})[ks] = (r[1], r[2])
        snap: dict[int, State] = {r[0]: (r[1], r[2], per_ks.get(r[0])) for r in d.get("s", [])}
        return cls(int(d["t"]), rows, snap)

    def encode(self) -> bytes:
        per_ks: dict[str, list[list[int]]] = {}
        for i, (_k, _b, kss) in sorted(self.snap.items()):
            for ks, (k, b) in sorted((kss or {}).items()):
                per_ks.setdefault(ks, []).append([i, k, b])
        out: dict[str, object] = {
            "t": self.t,
            "m": {
                ks: [[i, *_trimmed(cols)] for i, cols in sorted(slots.items())]
                for ks, slots in sorted(self.rows.items())
            },
            "s": [[i, k, b] for i, (k, b, _kss) in sorted(self.snap.items())],
        }
        if per_ks:
            out["k"] = per_ks
        return orjson.dumps(out)

    def add(self, ks: str, slot: int, cols: Sequence[int]) -> None:
        add_cols(self.rows.setdefault(ks, {}), slot, cols)

    def sums(self) -> dict[str, list[int]]:
        """Per keyspace, the columns summed over every slot."""
        out: dict[str, list[int]] = {}
        for ks, slots in self.rows.items():
            tot = [0] * len(COLS)
            for cols in slots.values():
                for j, v in enumerate(cols):
                    tot[j] += v
            out[ks] = tot
        return out


def _padded(cols: Sequence[int]) -> list[int]:
    """A stored row's columns, the ones it leaves out (written before them, or zero) as 0."""
    return [*cols, *[0] * (len(COLS) - len(cols))]


def _trimmed(cols: Sequence[int]) -> Sequence[int]:
    """A row's columns as stored: trailing zeros beyond `_STORED_MIN` left out."""
    n = len(cols)
    while n > _STORED_MIN and cols[n - 1] == 0:
        n -= 1
    return cols[:n]


_WRITTEN, _DELETED, _DUPLICATE = Status.WRITTEN, Status.DELETED, Status.DUPLICATE
_STATUS, _KEY, _VALUE = itemgetter(0), itemgetter(1), itemgetter(2)


def count_results(
    ops: Sequence[Op], results: Sequence[Result], keyspace_of: Callable[[bytes], str] | str
) -> dict[str, list[int]]:
    """Columns per keyspace for one request's ops and their results. `keyspace_of` is a
    function of the key, or the keyspace itself when the producer has only one (the
    common case: no per-op call; this runs in the commit thread for every op)."""
    if isinstance(keyspace_of, str):
        return _count_one(ops, results, keyspace_of)
    if isinstance(keyspace_of, Finder) and ops:
        ks = keyspace_of.common(list(map(_KEY, ops)))
        if ks is not None:  # one keyspace for all: no per-op call
            return _count_one(ops, results, ks)
    groups: dict[str, tuple[list[Op], list[Result]]] = {}
    for op, res in zip(ops, results, strict=True):
        g = groups.get(ks := keyspace_of(op.key))
        if g is None:
            g = groups[ks] = ([], [])
        g[0].append(op)
        g[1].append(res)
    out: dict[str, list[int]] = {}
    for ks, (o, r) in groups.items():
        out.update(_count_one(o, r, ks))
    return out


def _count_one(ops: Sequence[Op], results: Sequence[Result], ks: str) -> dict[str, list[int]]:
    if _fast_count is not None and type(ops) is list and type(results) is list:
        w, bw, d, dup = _fast_count(ops, results, _WRITTEN, _DELETED, _DUPLICATE)
    else:
        w, bw, d, dup = _count_one_py(ops, results)
    if not (w or d or dup):
        return {}
    return {ks: [w, bw, d, dup, 0, 0, 0, 0]}


def _count_one_py(ops: Sequence[Op], results: Sequence[Result]) -> tuple[int, int, int, int]:
    """(writes, bytes written, deletes, duplicates): the reference of
    `gateway/_usagecount.pyx`. C-level passes (map/itemgetter/len/compress): a Python loop
    over a 1,000-op request cost about a millisecond with the GIL held."""
    statuses = list(map(_STATUS, results))
    w, d, dup = statuses.count(_WRITTEN), statuses.count(_DELETED), statuses.count(_DUPLICATE)
    written = ops if w == len(ops) else list(compress(ops, map(_WRITTEN.__eq__, statuses)))
    bw = sum(map(len, map(_KEY, written))) + sum(map(len, map(_VALUE, written))) if w else 0
    return w, bw, d, dup


def keyspace_finder(keyspaces: Sequence[str]) -> Callable[[bytes], str] | str:
    """`key -> keyspace` over a producer's keyspaces (longest prefix; "" when none), or
    the keyspace itself when there is only one."""
    if len(keyspaces) == 1:
        return keyspaces[0]
    return Finder(keyspaces)


class Finder:
    """`key -> keyspace` (the longest prefix; "" when none) over several keyspaces."""

    def __init__(self, keyspaces: Sequence[str]) -> None:
        self.prefixes = sorted(((k.encode(), k) for k in keyspaces), key=lambda p: -len(p[0]))

    def __call__(self, key: bytes) -> str:
        for p, k in self.prefixes:
            if key.startswith(p):
                return k
        return ""

    def common(self, keys: list[bytes]) -> str | None:
        """The keyspace of every key when they all have the same one, else None (maybe
        they do): the least and the greatest key share it and no other keyspace begins
        between them (keys under one prefix form one range in byte order; a keyspace
        beginning before the least key and not holding it holds none of them)."""
        lo, hi = min(keys), max(keys)
        ks = self(lo)
        if not ks or self(hi) != ks:
            return None
        for p, k in self.prefixes:
            if k != ks and lo < p <= hi:
                return None
        return ks


class UsageSeries:
    """Minute counters in memory and the documents they fold into.

    Thread use: `due`/`written` run in the batcher's commit thread, `add_results` on the
    event loop once a batch's futures are resolved, `add_quota` from `due`, `query` in
    route handlers (or a worker thread); one lock guards the state.
    """

    def __init__(
        self,
        load: LoadFn,
        list_names: ListFn,
        keyspaces: Callable[[str], Sequence[str]],
        quota_counts: Callable[[], Mapping[str, Mapping[str, int]]] = dict,
        clock: Callable[[], float] = time.time,
        keyspace_usage: Callable[[str], Mapping[str, tuple[int, int]]] | None = None,
        track: Callable[[Mapping[str, Sequence[str]]], object] | None = None,
    ) -> None:
        self._load = load
        self._list = list_names
        self._keyspaces = keyspaces
        #: The store's (keys, bytes) per keyspace of a producer with several, and the call
        #: that tells the store which producers those are (`Store.track_keyspaces`).
        self._ks_usage = keyspace_usage
        self._track = track
        self._tracked: dict[str, tuple[str, ...]] = {}
        self._quota_counts = quota_counts
        self._quota_seen: dict[tuple[str, str], int] = {}
        self.clock = clock
        self._lock = threading.Lock()
        # (producer, minute start) -> keyspace -> columns: minutes not yet folded
        self._open: dict[tuple[str, int], dict[str, list[int]]] = {}
        self._docs: dict[str, SlotDoc] = {}  # documents touched recently (cache)
        # minutes folded into their block's document, not yet into the day's (rollup)
        self._unrolled: dict[tuple[str, int], dict[str, list[int]]] = {}
        self._snaps: dict[tuple[str, int], State] = {}
        # the state before a producer's first batch of a minute, as the previous minute's
        # end; written with that minute's document
        self._presnap: dict[tuple[str, int], State] = {}
        self._dirty: set[str] = set()
        self._deleted: set[str] = set()
        self._last_retention = 0.0
        #: Documents dropped from the cache so far: a query reads the stored documents
        #: before the cache, and one evicted in between (written meanwhile) would be in
        #: neither version it saw, so it reads again when this moved (`query`).
        self.evictions = 0

    def keyspaces_of(self, producer: str) -> Sequence[str]:
        """`producer`'s keyspaces now."""
        return self._keyspaces(producer)

    def keyspace_usage(self, producer: str) -> Mapping[str, tuple[int, int]] | None:
        """(keys, bytes) per keyspace now of a producer with several keyspaces, else None."""
        if self._ks_usage is None or len(self._tracked.get(producer, ())) < 2:
            return None
        return self._ks_usage(producer)

    def _sync_keyspaces(self, producers: Iterable[str]) -> None:
        """Tell the store about producers whose keyspaces changed (it recounts those with
        several; before the batch that follows, so that its ops are counted)."""
        if self._track is None:
            return
        changed = False
        for p in producers:
            kss = tuple(self._keyspaces(p))
            if self._tracked.get(p) != kss:
                self._tracked[p] = kss
                changed = True
        if changed:
            self._track({p: k for p, k in self._tracked.items() if len(k) > 1})

    def _state(self, producer: str, usage: Mapping[str, tuple[int, int]]) -> State:
        k, b = usage.get(producer, (0, 0))
        per_ks = self.keyspace_usage(producer)
        return (k, b, None if per_ks is None else dict(per_ks))

    # -- counting ---------------------------------------------------------------------

    def _bucket(self, producer: str, now: float) -> dict[str, list[int]]:
        key = (producer, int(now) // 60 * 60)
        b = self._open.get(key)
        if b is None:
            b = self._open[key] = {}
        return b

    def add_results(
        self, producer: str, ops: Sequence[Op], results: Sequence[Result], now: float
    ) -> None:
        """Count one committed request's results in the minute holding `now`."""
        counts = count_results(ops, results, keyspace_finder(self._keyspaces(producer)))
        if not counts:
            return
        with self._lock:
            b = self._bucket(producer, now)
            for ks, cols in counts.items():
                add_cols(b, ks, cols)

    def add_requests(
        self, requests: Sequence[Counted], results: Sequence[Sequence[Result]], now: float
    ) -> None:
        """Count one committed batch's requests (each with its results) in the minute
        holding `now`: the ops of each producer in one pass (`count_results`), not one
        call per request — a batch of a thousand one-pair PUTs cost ~10 ms per-request."""
        by_producer: dict[str, tuple[list[Op], list[Result]]] = {}
        for r, res in zip(requests, results, strict=True):
            g = by_producer.get(r.producer)
            if g is None:
                g = by_producer[r.producer] = ([], [])
            g[0].extend(r.ops)
            g[1].extend(res)
        for producer, (ops, res) in by_producer.items():
            self.add_results(producer, ops, res, now)

    def add_expiries(self, ops: Sequence[Op], results: Sequence[Result], now: float) -> None:
        """Count the keys the root expired (the expirer's EXPIRE ops whose result is
        `expired`) under their owner, in the minute holding `now`: in the `expiries`
        column, never in `deletes`; the expirer is no producer, so no quota sees them."""
        per_owner: dict[str, list[bytes]] = {}
        for op, res in zip(ops, results, strict=True):
            if res.status == Status.EXPIRED and op.owner:
                per_owner.setdefault(op.owner, []).append(op.key)
        if not per_owner:
            return
        counts: dict[str, dict[str, int]] = {}
        for owner, keys in per_owner.items():
            find = keyspace_finder(self._keyspaces(owner))
            by_ks = counts[owner] = {}
            if isinstance(find, str):  # one keyspace: no per-key call
                by_ks[find] = len(keys)
                continue
            for k in keys:
                ks = find(k)
                by_ks[ks] = by_ks.get(ks, 0) + 1
        with self._lock:
            for owner, by_ks in counts.items():
                b = self._bucket(owner, now)
                for ks, n in by_ks.items():
                    b.setdefault(ks, [0] * len(COLS))[_EXP] += n

    def add_quota(self, now: float) -> None:
        """Count quota outcomes since the last call (from the admission's running totals,
        which start at zero with the process) in the minute holding `now`."""
        # Copied in one step each (C-level, under the GIL): the event loop updates them.
        counts = [(p, list(o.items())) for p, o in list(self._quota_counts().items())]
        with self._lock:
            for producer, outcomes in counts:
                for outcome, total in outcomes:
                    col = QUOTA_COL.get(outcome)
                    if col is None:
                        continue
                    seen = self._quota_seen.get((producer, outcome), 0)
                    if total > seen:
                        self._quota_seen[(producer, outcome)] = total
                        row = self._bucket(producer, now).setdefault("", [0] * len(COLS))
                        row[col] += total - seen

    # -- folding into documents ------------------------------------------------------

    def _doc(self, name: str, t: int) -> SlotDoc:
        d = self._docs.get(name)
        if d is None:
            d = self._docs[name] = SlotDoc.decode(self._load(name), t)
        return d

    def due(
        self,
        now: float,
        usage: Callable[[], Mapping[str, tuple[int, int]]],
        *,
        all_: bool = False,
        starting: Iterable[str] = (),
    ) -> dict[str, bytes | None]:
        """Fold the minutes that are over (every minute with `all_`) into their documents
        and return every document changed and not yet written (name -> bytes, None to
        delete). `usage()` gives (keys, bytes) per producer now: the state at the end of
        the folded minutes, since no batch committed after them yet. `starting` are the
        producers of the batch about to commit: one that starts a new minute gets the
        state now as the previous minute's end, so a range shows where growth started
        from (a new producer's first point is 0, not missing)."""
        self.add_quota(now)
        cur_minute = int(now) // 60 * 60
        starting = list(starting)
        with self._lock:
            closed = [k for k in self._open if all_ or k[1] < cur_minute]
            new = [p for p in starting if (p, cur_minute) not in self._open]
            snap = usage() if closed or new else {}
            # Every known producer once a minute (an ACL change reaches the store even for
            # one that does not write), the batch's producers every batch.
            self._sync_keyspaces([*starting, *snap])
            for producer in new:
                # Held until this minute closes too, so that it rides with that minute's
                # document instead of adding a log entry to a batch of its own.
                self._presnap.setdefault((producer, cur_minute - 60), self._state(producer, snap))
            for (producer, prev), state in list(self._presnap.items()):
                if all_ or prev + 60 < cur_minute:
                    del self._presnap[(producer, prev)]
                    hname = block_name(producer, prev)
                    hdoc = self._doc(hname, prev // BLOCK * BLOCK)
                    hdoc.snap.setdefault((prev - hdoc.t) // 60, state)
                    self._snaps.setdefault((producer, prev), state)
                    self._dirty.add(hname)
            for producer, minute in sorted(closed, key=lambda k: k[1]):
                bucket = self._open.pop((producer, minute))
                block = minute // BLOCK * BLOCK
                hname = block_name(producer, minute)
                hdoc = self._doc(hname, block)
                for ks, cols in bucket.items():
                    hdoc.add(ks, (minute - block) // 60, cols)
                if producer in snap:
                    state = self._state(producer, snap)
                    hdoc.snap[(minute - block) // 60] = state
                    self._snaps[(producer, minute)] = state
                # Added to, not replaced: a batch's counts arrive on the event loop after
                # its commit, so a minute the next batch's commit already closed can open
                # and close again with them.
                unrolled = self._unrolled.setdefault((producer, minute), {})
                for ks, cols in bucket.items():
                    add_cols(unrolled, ks, cols)
                self._dirty.add(hname)
            self._roll(cur_minute // BLOCK * BLOCK, all_)
            if now - self._last_retention >= 3600:
                self._last_retention = now
                self._deleted.update(self._expired(now, usage()))
            self._evict(cur_minute)
            out: dict[str, bytes | None] = {n: self._docs[n].encode() for n in self._dirty}
            out.update(dict.fromkeys(self._deleted))
            return out

    def _roll(self, cur_block: int, all_: bool) -> None:
        """Add the folded minutes of the blocks that are over into the day documents: a
        day document is rewritten once per block (not per minute), which keeps what the
        log carries for it small."""
        keys = {k for k in (*self._unrolled, *self._snaps) if all_ or k[1] < cur_block}
        for producer, minute in sorted(keys, key=lambda k: k[1]):
            if all_ or minute // BLOCK * BLOCK < cur_block:
                day = minute // 86400 * 86400
                dname = day_name(producer, minute)
                ddoc = self._doc(dname, day)
                for ks, cols in self._unrolled.pop((producer, minute), {}).items():
                    ddoc.add(ks, (minute - day) // 3600, cols)
                s = self._snaps.pop((producer, minute), None)
                if s is not None:
                    ddoc.snap[(minute - day) // 3600] = s
                self._dirty.add(dname)

    def written(self, changes: Iterable[str]) -> None:
        """The documents named were committed."""
        with self._lock:
            for n in changes:
                self._dirty.discard(n)
                self._deleted.discard(n)

    def _evict(self, cur_minute: int) -> None:
        # Keep only the current block's and day's documents (and unwritten ones) cached.
        block, day = cur_minute // BLOCK * BLOCK, cur_minute // 86400 * 86400
        for n in [n for n, d in self._docs.items() if d.t not in (block, day)]:
            if n not in self._dirty:
                del self._docs[n]
                self.evictions += 1

    def _expired(self, now: float, producers: Iterable[str]) -> list[str]:
        """Names of documents past retention: per producer, the oldest few (names sort
        by time within a producer; the pass runs hourly, so a few suffice)."""
        out = []
        for producer in producers:
            for kind, keep, suffix in (
                ("m", MINUTE_KEEP_S, block_suffix),
                ("h", HOUR_KEEP_S, day_suffix),
            ):
                cutoff = suffix(now - keep)
                prefix = f"usage/{kind}/{producer}/"
                for name, _raw in self._list(prefix, "", 160):
                    if name[len(prefix) :] < cutoff:
                        out.append(name)
        return out

    # -- reading back -----------------------------------------------------------------

    def list_docs(self, prefix: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        """Stored documents (see `ListFn`)."""
        return self._list(prefix, after, limit)

    def view(
        self, producer: str, prefix: str, start: str, end: str, *, rollup: bool
    ) -> tuple[int, dict[str, bytes], dict[int, dict[str, list[int]]], dict[int, State]]:
        """In one consistent look: `evictions` so far, the in-memory documents under
        `prefix` with suffix in [start, end] (encoded), the minutes of `producer` in no
        such document yet (minute start -> keyspace -> columns: the open ones, and with
        `rollup` those not yet rolled into the day documents) and their (keys, bytes)
        snapshots."""
        with self._lock:
            docs = {
                n: d.encode()
                for n, d in self._docs.items()
                if n.startswith(prefix) and start <= n[len(prefix) :] <= end
            }
            sources = [self._open, self._unrolled] if rollup else [self._open]
            minutes: dict[int, dict[str, list[int]]] = {}
            for src in sources:
                for (p, m), b in src.items():
                    if p == producer:
                        for ks, c in b.items():
                            add_cols(minutes.setdefault(m, {}), ks, c)
            snaps = {m: v for (p, m), v in self._presnap.items() if p == producer}
            if rollup:
                snaps.update((m, v) for (p, m), v in self._snaps.items() if p == producer)
            return self.evictions, docs, minutes, snaps


@dataclass(frozen=True)
class Range:
    since: int
    until: int
    step: int


def parse_time(s: str, now: float) -> int:
    """RFC 3339 (``2026-11-23T10:00:00Z``) or relative (``-24h``, ``24h``, ``-30m``,
    ``-7d``, ``now``) -> epoch seconds. ValueError otherwise."""
    s = s.strip()
    if s == "now":
        return int(now)
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    body = s[1:] if s.startswith("-") else s
    if body[:-1].isdigit() and body[-1:] in units:
        return int(now) - int(body[:-1]) * units[body[-1]]
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"time {s!r} is neither RFC 3339 (2026-11-23T10:00:00Z) nor relative "
            "(-24h, -30m, -7d, now)"
        ) from None
    if dt.tzinfo is None:
        raise ValueError(f"time {s!r} has no timezone (use Z or +hh:mm)")
    return int(dt.timestamp())


def parse_range(since: str | None, until: str | None, step: str | None, now: float) -> Range:
    """The query's range: default the last 24 h; step defaults to the finest that gives at
    most MAX_POINTS points. ValueError for a bad value or too many points."""
    t1 = parse_time(until, now) if until else int(now)
    if t1 == int(now):
        # A range ending now holds the present second: `until` is exclusive, so without
        # this the step just opened (and what was written in its first second) would be
        # left out of the answer until the clock passed that second.
        t1 += 1
    t0 = parse_time(since, now) if since else t1 - 86400
    if t0 >= t1:
        raise ValueError("since must be before until")
    if step is None:
        st = next(v for v in STEPS.values() if (t1 - t0) // v <= MAX_POINTS)
    elif step in STEPS:
        st = STEPS[step]
    else:
        raise ValueError(f"step must be one of {', '.join(STEPS)}")
    if (t1 - t0) // st > MAX_POINTS:
        raise ValueError(f"{(t1 - t0) // st} points; at most {MAX_POINTS} (use a coarser step)")
    return Range(t0 // st * st, t1, st)


def query(
    series: UsageSeries,
    producer: str,
    keyspace: str | None,
    rng: Range,
    now_usage: tuple[int, int] | None,
    start: dict[str, int | None] | None = None,
    now: float | None = None,
) -> list[dict[str, int | None]]:
    """Points of `producer` (one keyspace, or all with None) over `rng`: one per step,
    oldest first, counters summed over the step, keys/bytes as at the step's end (carried
    forward from the last snapshot; None before any, and for a keyspace of a producer with
    several in snapshots written before the store counted per keyspace). A `start` dict
    gets the range's starting "keys"/"bytes" at full resolution: the last state known at
    or before `since`, else the first after it (a producer created within one step still
    shows its growth)."""
    raw: list[tuple[int, tuple[int, int] | None]] = []  # (time, state) of every snapshot
    # The producer's keys/bytes are its keyspace's when it has no other.
    whole = keyspace is None or tuple(series.keyspaces_of(producer)) == (keyspace,)

    def pick(state: State | tuple[int, int] | None) -> tuple[int, int] | None:
        if state is None or whole:
            return None if state is None else (state[0], state[1])
        per_ks = state[2] if len(state) > 2 else None
        return None if per_ks is None else per_ks.get(keyspace or "", (0, 0))

    if not whole:
        per_ks_now = series.keyspace_usage(producer)
        now_state: State | None = (
            None if now_usage is None or per_ks_now is None else (*now_usage, dict(per_ks_now))
        )
    else:
        now_state = None if now_usage is None else (*now_usage, None)
    minute_docs = rng.step < 3600
    unit = 60 if minute_docs else 3600
    kind, width, suffix = ("m", BLOCK, block_suffix) if minute_docs else ("h", 86400, day_suffix)
    # slot start (epoch) -> columns, and snapshot slots
    cols: dict[int, list[int]] = {}
    snaps: dict[int, tuple[int, int] | None] = {}

    def take(t_slot: int, ks: str, c: Sequence[int]) -> None:
        if keyspace is not None and ks != keyspace:
            return
        add_cols(cols, t_slot, c)

    first_t = rng.since - width  # one document earlier: the snapshot to carry forward
    lo, hi = suffix(first_t // width * width), suffix(rng.until)
    prefix = f"usage/{kind}/{producer}/"
    limit = (rng.until - first_t) // width + 2
    while True:
        # Stored first, then memory: a minute leaves memory only into a cached document,
        # and a cached one leaves only once written, so the two reads miss nothing
        # unless a document was evicted in between (then read both again).
        seen = series.evictions
        found = stored_docs(series, prefix, lo, hi, limit)
        evicted, cached, minutes, minute_snaps = series.view(
            producer, prefix, lo, hi, rollup=not minute_docs
        )
        if evicted == seen:
            break
    found.update(cached)  # the in-memory versions are the newer ones
    for _name, body in sorted(found.items()):
        d = SlotDoc.decode(body, 0)
        for ks, slots in d.rows.items():
            for i, c in slots.items():
                take(d.t + i * unit, ks, c)
        for i, s in d.snap.items():
            snaps[d.t + i * unit] = pick(s)
            raw.append((d.t + i * unit, pick(s)))
    # The minutes still in memory (and, at a coarser step, not yet in any document).
    for minute, bucket in minutes.items():
        for ks, c in bucket.items():
            take(minute // unit * unit, ks, c)
    for minute, snap in sorted(minute_snaps.items()):  # later than the rolled ones
        snaps[minute // unit * unit] = pick(snap)
        raw.append((minute, pick(snap)))
    if now_state is not None:
        # `now`: the time `rng` was parsed at. A range ending now has the state now in its
        # last point, even when the clock turned a minute since (the state before the
        # minute's first batch would answer otherwise: a new producer's zero).
        now_t = int(series.clock() if now is None else now)
        slot = now_t // unit * unit
        if rng.until >= now_t:
            slot = min(slot, rng.until - 1)
        snaps[slot] = pick(now_state)
        raw.append((now_t, pick(now_state)))
    if start is not None:
        raw.sort(key=itemgetter(0))
        before = [st for t, st in raw if t <= rng.since]
        after = [st for t, st in raw if rng.since < t <= rng.until]
        began = before[-1] if before else (after[0] if after else None)
        start["keys"] = None if began is None else began[0]
        start["bytes"] = None if began is None else began[1]

    points: list[dict[str, int | None]] = []
    snap_times = sorted(snaps)
    si = 0
    last: tuple[int, int] | None = None
    for t in range(rng.since, rng.until, rng.step):
        tot = [0] * len(COLS)
        for ts in range(t, t + rng.step, unit):
            got = cols.get(ts)
            if got is not None:
                for j, v in enumerate(got):
                    tot[j] += v
        while si < len(snap_times) and snap_times[si] < t + rng.step:
            last = snaps[snap_times[si]]
            si += 1
        p: dict[str, int | None] = {"t": t}
        p.update(zip(COLS[:5], tot[:5], strict=True))
        p["refused"] = tot[_R429] + tot[_R413]
        p["refused_429"] = tot[_R429]
        p["refused_413"] = tot[_R413]
        p["expiries"] = tot[_EXP]
        p["keys"] = None if last is None else last[0]
        p["bytes"] = None if last is None else last[1]
        points.append(p)
    return points


def stored_docs(
    series: UsageSeries, prefix: str, start: str, end: str, limit: int
) -> dict[str, bytes]:
    """Stored documents under `prefix` whose suffix lies in [start, end] (digit strings)."""
    # The name just before `start`: its last digit lowered by one ('0' -> '/').
    after = prefix + start[:-1] + chr(ord(start[-1]) - 1)
    return {
        n: raw
        for n, raw in series.list_docs(prefix, after, limit)
        if start <= n[len(prefix) :] <= end
    }


def for_store(
    store: Store,
    keyspaces: Callable[[str], Sequence[str]],
    quota_counts: Callable[[], Mapping[str, Mapping[str, int]]],
) -> UsageSeries:
    """A series reading its documents from `store` (the root's)."""

    def load(name: str) -> bytes | None:
        d = store.get_doc(name)
        return None if d is None else d.body

    def list_docs(prefix: str, after: str, limit: int) -> list[tuple[str, bytes]]:
        return [(n, d.body) for n, d in store.scan_docs(prefix, after=after, limit=limit)]

    return UsageSeries(
        load,
        list_docs,
        keyspaces,
        quota_counts,
        keyspace_usage=store.keyspace_usage,
        track=store.track_keyspaces,
    )
