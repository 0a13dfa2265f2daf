"""The replication status a replica's worker publishes to its reading parent.

The worker (the child process that applies the stream) rewrites ``DATA_DIR/replication.json``
when something changed, at most every `FLUSH_SECONDS`; the parent reads it to answer
`/v1/status` and to export the lag metrics. Lag is computed by the reader at read time from
the published facts (`replicator/lag.py`), so a dead worker shows a growing lag, not a
frozen one.

The document is rewritten in place, not replaced: a temp file renamed over the old one made
ext4 start writing the new file back at every rename (its guard for applications that
replace files without syncing them): 200-240 µs of the worker's CPU per flush, 20 times a
second, on the core that serves reads, against 30 µs in place (`bench/status_flush.py`);
what makes a read of a half-written document harmless is the document's layout: one line of
JSON, then a line holding the CRC-32 of that line in hex, then spaces over whatever a
longer earlier document left. A reader that finds the CRC wrong (it read during a write)
reads again; a document without the CRC line (an earlier release's) is read as plain JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Any

from replicator.lag import lag_seconds

FLUSH_SECONDS = 0.05
FILE_NAME = "replication.json"
#: Reads of a document caught mid-write before `read_status` gives up (None). A write is
#: one `pwrite` of a few hundred bytes, over within microseconds, and the next comes 50 ms
#: later: a read that caught one reads a whole document on its next try.
READ_TRIES = 5


def status_path(data_dir: str) -> str:
    """Path of the status document of the replica in `data_dir`."""
    return os.path.join(data_dir, FILE_NAME)


@dataclass
class ReplicaStatus:
    """Facts about the replication of one node."""

    pid: int = 0
    state: str = "starting"
    source: str | None = None
    applied_seq: int = 0
    known_us: int = 0
    hb_time_us: int = 0
    hb_seq: int = 0
    hb_interval_ms: int = 1000
    error: str | None = None
    errors: dict[str, int] = field(default_factory=dict)
    #: Connections this node's replication source refused, by reason (its metric).
    refused: dict[str, int] = field(default_factory=dict)
    #: What this worker has applied since it started (counters for the parent's metrics):
    #: log records, their bytes as replicated (header and compressed payload), the write
    #: transactions they took and the seconds spent inside those transactions.
    applied_records: int = 0
    applied_bytes: int = 0
    apply_commits: int = 0
    apply_seconds: float = 0.0
    #: CPU seconds (user + system, every thread) this worker has used, as of `updated_us`.
    cpu_seconds: float = 0.0
    updated_us: int = 0

    def lag(self, now_us: int | None = None) -> float | None:
        """Lag in seconds relative to the root (None before any contact)."""
        now = time.time_ns() // 1000 if now_us is None else now_us
        return lag_seconds(
            now, self.applied_seq, self.known_us, self.hb_time_us, self.hb_seq, self.hb_interval_ms
        )


def encode_document(doc: dict[str, Any], pad_to: int = 0) -> bytes:
    """The published bytes of `doc`: its JSON on one line, the line's CRC-32 in hex on the
    next, then spaces up to `pad_to` bytes (over a longer earlier document)."""
    line = json.dumps(doc, separators=(",", ":")).encode()
    out = b"%s\n%08x\n" % (line, zlib.crc32(line))
    return out + b" " * (pad_to - len(out))


def decode_document(raw: bytes) -> dict[str, Any] | None:
    """The document in `raw`, or None when it is torn (its CRC line does not match) or not
    a JSON object. Without a CRC line — a second line of exactly 8 hex digits — it is read
    as plain JSON (an earlier release's worker), which a torn document never is (the bytes
    after its first line are not part of the JSON)."""
    line, _, rest = raw.partition(b"\n")
    crc = rest.split(b"\n", 1)[0]
    if len(crc) == 8 and all(c in b"0123456789abcdef" for c in crc):
        if int(crc, 16) != zlib.crc32(line):
            return None
    else:
        line = raw
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def read_status(data_dir: str) -> ReplicaStatus | None:
    """The last published status, or None when there is none (or it is unreadable)."""
    raw: dict[str, Any] | None = None
    for _ in range(READ_TRIES):
        try:
            with open(status_path(data_dir), "rb") as f:
                raw = decode_document(f.read())
        except OSError:
            return None
        if raw is not None:
            break
    if raw is None:
        return None
    known = set(ReplicaStatus.__dataclass_fields__)
    return ReplicaStatus(**{k: v for k, v in raw.items() if k in known})


class StatusBoard:
    """The worker's side: holds the status and flushes it to disk when it changed."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.status = ReplicaStatus(pid=os.getpid())
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._fd = -1
        self._size = 0  # bytes the file holds (a shorter document pads over the rest)

    def update(self, **changes: Any) -> None:
        """Change fields and schedule a flush."""
        for k, v in changes.items():
            setattr(self.status, k, v)
        self._dirty.set()

    def count_error(self, kind: str, message: str) -> None:
        """Count one stream error of `kind` and show `message` as the last error."""
        self.status.errors[kind] = self.status.errors.get(kind, 0) + 1
        self.update(error=message)

    def flush(self) -> None:
        """Write the status now (in place; see the module docstring)."""
        self.status.updated_us = time.time_ns() // 1000
        self.status.cpu_seconds = time.process_time()
        fd = self._file()
        data = encode_document(asdict(self.status), self._size)
        os.pwrite(fd, data, 0)
        self._size = len(data)

    def _file(self) -> int:
        """The document's open file, opened again when it was removed or replaced."""
        path = status_path(self.data_dir)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            st = None
        if self._fd >= 0 and (st is None or st.st_ino != os.fstat(self._fd).st_ino):
            self.close()
        if self._fd < 0:
            os.makedirs(self.data_dir, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666)
            self._size = os.fstat(self._fd).st_size
        return self._fd

    def close(self) -> None:
        """Close the document's file (a later flush opens it again)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    async def run(self) -> None:
        """Flush whenever dirty, at most every FLUSH_SECONDS, until cancelled."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            with contextlib.suppress(OSError):
                self.flush()
            await asyncio.sleep(FLUSH_SECONDS)

    def start(self) -> None:
        """Start the flushing task on the running loop."""
        self.flush()
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        """Flush a last time and stop."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(OSError):
            self.flush()
        self.close()


def lag_gauge(data_dir: str) -> float:
    """Seconds the replica in `data_dir` is behind the root, NaN before any contact (for
    the `mercury_replication_lag_seconds` gauge)."""
    st = read_status(data_dir)
    value = st.lag() if st is not None else None
    return math.nan if value is None else value


def streaming(data_dir: str) -> float:
    """1.0 while the replica in `data_dir` streams from a source, else 0.0 (for the
    `mercury_replication_streaming` gauge: connecting, reconnecting, bootstrapping, a
    stopped or dead worker all read 0)."""
    st = read_status(data_dir)
    return 1.0 if st is not None and st.state == "streaming" else 0.0


def diverged(data_dir: str) -> float:
    """1.0 when the replica in `data_dir` stopped on a diverged history, else 0.0 (for the
    `mercury_replication_diverged` gauge)."""
    st = read_status(data_dir)
    return 1.0 if st is not None and st.state == "diverged" else 0.0
