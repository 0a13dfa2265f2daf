"""The replication status a replica's worker publishes to its reading parent.

The worker (the child process that applies the stream) writes ``DATA_DIR/replication.json``
atomically (temp file + rename) when something changed, at most every `FLUSH_SECONDS`; the
parent reads it to answer `/v1/status` and to export the lag metrics. Lag is computed by
the reader at read time from the published facts (`replicator/lag.py`), so a dead worker
shows a growing lag, not a frozen one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from replicator.lag import lag_seconds

FLUSH_SECONDS = 0.05
FILE_NAME = "replication.json"


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


def read_status(data_dir: str) -> ReplicaStatus | None:
    """The last published status, or None when there is none (or it is unreadable)."""
    try:
        with open(status_path(data_dir)) as f:
            raw: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
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
        """Write the status now (atomically)."""
        self.status.updated_us = time.time_ns() // 1000
        self.status.cpu_seconds = time.process_time()
        os.makedirs(self.data_dir, exist_ok=True)
        path = status_path(self.data_dir)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(asdict(self.status), f)
        os.replace(tmp, path)

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


def lag_gauge(data_dir: str) -> float:
    """Seconds the replica in `data_dir` is behind the root, NaN before any contact (for
    the `mercury_replication_lag_seconds` gauge)."""
    st = read_status(data_dir)
    value = st.lag() if st is not None else None
    return math.nan if value is None else value


def diverged(data_dir: str) -> float:
    """1.0 when the replica in `data_dir` stopped on a diverged history, else 0.0 (for the
    `mercury_replication_diverged` gauge)."""
    st = read_status(data_dir)
    return 1.0 if st is not None and st.state == "diverged" else 0.0
