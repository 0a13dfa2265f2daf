"""Log retention: a node's periodic garbage collection of old log records.

A `RetentionService` calls `Store.gc_log` every `interval` seconds in a worker thread (a
write transaction must never run on the event loop), bounded per call so each transaction
stays short; it runs again at once while there is more to drop. Defaults keep a week of
history, and never fewer than 100,000 entries, so replicas that were offline can catch up
instead of bootstrapping.

On a replica the pass also forgets idempotency answers older than
`RetentionPolicy.idempotency_keep_seconds` (they come through the log since format 5; on
the root the gateway expires its own by its TTL), at most every `ANSWERS_EVERY_S`: that
scan reads every stored answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from core.errors import MercuryError
from store.store import Store

log = logging.getLogger("mercury.retention")

WEEK = 7 * 24 * 3600.0
#: How long a replica keeps idempotency answers: longer than any root's TTL (default 48 h),
#: so a promoted replica still answers a retry; its gateway then applies its own TTL.
REPLICA_ANSWERS_KEEP_S = WEEK
ANSWERS_EVERY_S = 600.0


@dataclass(frozen=True)
class RetentionPolicy:
    """What to keep: entries by count and/or age, never fewer than `min_entries`."""

    keep_entries: int | None = None
    keep_seconds: float | None = WEEK
    min_entries: int = 100_000
    interval: float = 10.0
    #: Forget idempotency answers stored longer ago than this (None: never; the root's
    #: gateway collects its own).
    idempotency_keep_seconds: float | None = None


class RetentionService:
    """Runs `Store.gc_log` periodically (a `core.service.Service`)."""

    name = "retention"

    def __init__(self, store: Store, policy: RetentionPolicy) -> None:
        self._store = store
        self._policy = policy
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0
        self._answers_due = 0.0

    async def start(self) -> None:
        """Start the periodic collection."""
        self._task = asyncio.create_task(self._run(), name="log-retention")

    async def stop(self) -> None:
        """Stop after the current collection (if any) finishes."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def collect_once(self) -> int:
        """One bounded collection; returns the entries dropped (blocking: call in a thread)."""
        p = self._policy
        n = self._store.gc_log(
            keep_entries=p.keep_entries, keep_seconds=p.keep_seconds, min_entries=p.min_entries
        )
        if p.idempotency_keep_seconds is not None and time.monotonic() >= self._answers_due:
            self._answers_due = time.monotonic() + ANSWERS_EVERY_S
            self._store.gc_idempotency(int((time.time() - p.idempotency_keep_seconds) * 1e6))
        return n

    async def _run(self) -> None:
        while True:
            try:
                n = await asyncio.to_thread(self.collect_once)
            except MercuryError as err:
                log.warning("log retention failed: %s", err)
                n = 0
            self.dropped += n
            if n:
                log.info("log retention dropped %d entries", n)
                continue  # more may be due: the call is bounded
            await asyncio.sleep(self._policy.interval)
