"""Usage counters in a write transaction, and the ones deferred in memory.

A usage delta maps owner -> [keys, bytes, writes, deletes, duplicates, throttled]
increments (the order of `store.usage.Usage`). `write_usage` adds a delta to the stored
records inside the caller's write transaction.

Counters that change without any data change (duplicates, throttling) are deferred: a
duplicate-only workload must write nothing to disk. `DeferredCounters` holds them until the
next batch that writes anything takes them, or `Store.flush_counters` (at most
`COUNTER_DEFER_S` late) or close commits them; a crash loses at most that much of these
statistics, never data.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from store.usage import Usage, usage_key

#: Longest time duplicate/throttle counters stay in memory before they are committed.
COUNTER_DEFER_S = 60.0

Delta = dict[str, list[int]]


def bump(delta: Delta, owner: str, idx: int, n: int) -> None:
    """Add `n` to counter `idx` of `owner` in `delta`."""
    d = delta.get(owner)
    if d is None:
        d = delta[owner] = [0, 0, 0, 0, 0, 0]
    d[idx] += n


def write_usage(txn: Any, meta_db: Any, delta: Delta) -> None:
    """Add `delta` to the usage records in the ``meta`` sub-database, inside `txn`."""
    for owner, d in delta.items():
        k = usage_key(owner)
        u = Usage.decode(txn.get(k, db=meta_db))
        u.add(Usage(*d))
        txn.put(k, u.encode(), db=meta_db)


class DeferredCounters:
    """Duplicate/throttled counts waiting in memory for the next commit (thread-safe)."""

    def __init__(self, max_age_s: float = COUNTER_DEFER_S) -> None:
        self._max_age_s = max_age_s
        self._held: Delta = {}
        self._since: float | None = None
        self._lock = threading.Lock()

    def defer(self, delta: Delta) -> bool:
        """Keep `delta` in memory when it only holds duplicates/throttled counts and the
        held counts are young enough; False when the caller must commit it now."""
        if any(d[0] or d[1] or d[2] or d[3] for d in delta.values()):
            return False
        with self._lock:
            if self._since is not None and time.monotonic() - self._since > self._max_age_s:
                return False  # long enough in memory: commit them with this batch
            for owner, d in delta.items():
                for i, n in enumerate(d):
                    if n:
                        bump(self._held, owner, i, n)
                        if self._since is None:
                            self._since = time.monotonic()
        return True

    def take(self) -> Delta:
        """Everything held, now owned by the caller (who commits it or `restore`s it)."""
        with self._lock:
            out, self._held, self._since = self._held, {}, None
        return out

    def restore(self, taken: Delta) -> None:
        """Give back what `take` returned when its commit failed."""
        with self._lock:
            for owner, d in taken.items():
                for i, n in enumerate(d):
                    bump(self._held, owner, i, n)
            if taken and self._since is None:
                self._since = time.monotonic()

    def add_to(self, out: dict[str, Usage]) -> None:
        """Add the held counts to `out` (a report of the stored counters)."""
        with self._lock:
            for owner, d in self._held.items():
                out.setdefault(owner, Usage()).add(Usage(*d))
