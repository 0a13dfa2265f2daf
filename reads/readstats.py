"""Read counting for unused-key analytics: which keys this node served, per period.

The hook every read path calls is `note_read(key)` (or `note_reads(keys)`): with counting
off it is one global load and a compare; on, one `set.add` of the key's bytes (the
period's distinct keys, at most `MAX_KEYS`; past that, reads are counted as dropped and
the summary says how many, so the root can tell an answer may miss reads). Nothing is
hashed, encoded or written on the read path.

Every period a summary is made off the read path (`take` then `summaries`): the distinct
keys' 8-byte BLAKE2b hashes (`key_hash`) with the UTC day the period ended on. A hash
collision can only make an unread key look read, never the reverse: an "unused" answer
may miss a key, never list one that was read. Payload (little-endian), at most
`MAX_PAYLOAD` bytes, several for a busy period::

    0  1  format (1)
    1  4  UTC day number (days since 1970-01-01) the reads were counted on
    5  4  reads dropped because the period's set was full (u32, saturating)
    9  8n key hashes

On a replica the summaries go to the replication worker through `DATA_DIR/readstats/`
files (`spool`), which sends them upstream on its replication link; on the root they go
straight to its ledger. `ReadStatsService` is that periodic flush.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import struct
import time
from collections.abc import Callable, Iterable

from prometheus_client import Counter

log = logging.getLogger("mercury.reads.readstats")

KEYS_SUMMARISED = Counter(
    "mercury_read_keys_summarised",
    "Distinct keys read per summary period, summed over the periods (unused-key analytics)",
)
READS_UNCOUNTED = Counter(
    "mercury_reads_uncounted",
    "Reads not recorded for unused-key analytics: the period's key set was full, or the "
    "replication worker took no summaries for too long (those days are marked incomplete)",
)

FORMAT = 1
MAX_KEYS = 1 << 20
#: Summary payloads stay within one replication frame (`frames.MAX_UPSTREAM_PAYLOAD`).
MAX_PAYLOAD = 1 << 20
HASH_SIZE = 8
_HEAD = struct.Struct("<BII")
PER_PAYLOAD = (MAX_PAYLOAD - _HEAD.size) // HASH_SIZE
#: Seconds between two summaries (`MERCURY_READSTATS_PERIOD_S` overrides it: tests).
PERIOD = float(os.environ.get("MERCURY_READSTATS_PERIOD_S", "10"))
SPOOL_DIR = "readstats"
#: Files the worker has not taken yet beyond which new summaries are dropped (counted).
MAX_SPOOL_FILES = 256


class ReadCounter:
    """The distinct keys read since the last `take` (bounded)."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self.keys: set[bytes] = set()
        self.dropped = 0

    def note(self, key: bytes) -> None:
        """Count one read of `key`."""
        keys = self.keys
        if len(keys) < self.max_keys:
            keys.add(key)
        else:
            self.dropped += 1

    def take(self) -> tuple[set[bytes], int]:
        """The keys read (and reads dropped) since the last call; starts a new period. Call
        it on the readers' thread (`ReadStatsService` does)."""
        keys, self.keys = self.keys, set()
        dropped, self.dropped = self.dropped, 0
        return keys, dropped


_counter: ReadCounter | None = None


def note_read(key: bytes) -> None:
    """The read-path hook: count one read of `key` (no-op while counting is off)."""
    c = _counter
    if c is not None:  # ReadCounter.note, inlined: this runs on every read
        keys = c.keys
        if len(keys) < c.max_keys:
            keys.add(key)
        else:
            c.dropped += 1


def note_reads(keys: Iterable[bytes]) -> None:
    """Count reads of several keys (get_bulk, ranges with values)."""
    c = _counter
    if c is not None:
        for k in keys:
            c.note(k)


def enable(max_keys: int = MAX_KEYS) -> ReadCounter:
    """Turn counting on in this process; the counter the hooks feed."""
    global _counter
    if _counter is None:
        _counter = ReadCounter(max_keys)
    return _counter


def disable() -> None:
    """Turn counting off (the hooks become no-ops)."""
    global _counter
    _counter = None


def key_hash(key: bytes) -> bytes:
    """The 8-byte identity of `key` in summaries and in the root's ledger."""
    return hashlib.blake2b(key, digest_size=HASH_SIZE).digest()


def day_of(t: float) -> int:
    """UTC day number of epoch seconds `t`."""
    return int(t // 86400)


def summaries(keys: Iterable[bytes], day: int, dropped: int = 0) -> list[bytes]:
    """Payloads for the reads of one period (none when nothing was read or dropped)."""
    hashes = sorted({key_hash(k) for k in keys})
    if not hashes and not dropped:
        return []
    head = _HEAD.pack(FORMAT, day, min(dropped, 0xFFFFFFFF))
    out = []
    for i in range(0, max(len(hashes), 1), PER_PAYLOAD):
        out.append(head + b"".join(hashes[i : i + PER_PAYLOAD]))
        head = _HEAD.pack(FORMAT, day, 0)  # the drop count once
    return out


def decode(payload: bytes) -> tuple[int, int, list[bytes]]:
    """(day, dropped, hashes) of a summary payload; ValueError when malformed."""
    if len(payload) < _HEAD.size or (len(payload) - _HEAD.size) % HASH_SIZE:
        raise ValueError("malformed read summary")
    fmt, day, dropped = _HEAD.unpack_from(payload)
    if fmt != FORMAT:
        raise ValueError(f"read summary format {fmt} is not supported")
    body = payload[_HEAD.size :]
    return day, dropped, [body[i : i + HASH_SIZE] for i in range(0, len(body), HASH_SIZE)]


def add_dropped(payload: bytes, n: int) -> bytes:
    """`payload` with `n` more dropped reads in its header (saturating)."""
    fmt, day, dropped = _HEAD.unpack_from(payload)
    return _HEAD.pack(fmt, day, min(dropped + n, 0xFFFFFFFF)) + payload[_HEAD.size :]


def spool(data_dir: str) -> Callable[[bytes], None]:
    """A sink writing each payload as one file in `DATA_DIR/readstats/` for the replication
    worker (written then renamed: the worker never sees half a file). While
    `MAX_SPOOL_FILES` wait (the worker is down or cut off), payloads are dropped and their
    keys counted into the next one's dropped reads, so the root knows that day is lossy."""
    d = os.path.join(data_dir, SPOOL_DIR)
    os.makedirs(d, exist_ok=True)
    n = [0]
    lost = [0]

    def write(payload: bytes) -> None:
        waiting = len(os.listdir(d))
        if waiting >= MAX_SPOOL_FILES:
            keys = max(1, (len(payload) - _HEAD.size) // HASH_SIZE)
            lost[0] += keys
            READS_UNCOUNTED.inc(keys)
            log.warning("read summary dropped: %d files wait for the worker in %s", waiting, d)
            return
        if lost[0]:
            payload, lost[0] = add_dropped(payload, lost[0]), 0
        n[0] += 1
        name = f"{time.time_ns():020d}-{os.getpid()}-{n[0]}"
        tmp = os.path.join(d, f".{name}.tmp")
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, os.path.join(d, f"{name}.bin"))

    return write


class ReadStatsService:
    """Every `period` seconds, the period's reads as summaries into `sink` (in a thread:
    hashing a busy period's keys must not stall the readers' event loop). Stopping makes
    a last summary."""

    name = "readstats"

    def __init__(
        self,
        sink: Callable[[bytes], None],
        period: float = PERIOD,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.sink = sink
        self.period = period
        self.clock = clock
        self.counter = enable()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._flush()
        disable()

    def flush(self) -> int:
        """Summarise the reads since the last flush into the sink; the payloads made. Call
        it on the thread that runs the readers (or with none running)."""
        keys, dropped = self.counter.take()
        return self._emit(keys, dropped)

    async def _flush(self) -> None:
        # The swap happens on the readers' event loop, between two reads (a read noted on
        # another thread during a swap could land in the set being hashed); the hashing
        # and the sink run in a thread.
        keys, dropped = self.counter.take()
        await asyncio.to_thread(self._emit, keys, dropped)

    def _emit(self, keys: set[bytes], dropped: int) -> int:
        KEYS_SUMMARISED.inc(len(keys))
        READS_UNCOUNTED.inc(dropped)
        n = 0
        for payload in summaries(keys, day_of(self.clock()), dropped):
            try:
                self.sink(payload)
                n += 1
            except Exception:
                log.exception("read summary lost")
        return n

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            await self._flush()
