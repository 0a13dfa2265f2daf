"""The root's expirer: logs an expiry for every key whose deadline has passed.

Only the root decides that a key is gone, by writing it to the log: each due key becomes an
EXPIRE op (a delete that says it is an expiry, `store.ops.EXPIRE`) submitted through the
ordinary batcher, so it commits in an ordinary batch and every node — replicas, their
replicas, a watch stream — removes the key at the same seq. A replica never expires a key on
its own clock; until the expiry reaches it, it serves the key as the log says.

Each op is conditional on the seq of the record whose deadline was due (`expect_seq`): a key
rewritten after the expirer read it (with another deadline, or none) is left alone, and the
store removes only a key whose record still carries a deadline. The deadlines come from the
store's index (`store/expiry.py`), which every node keeps from the log: a restarted root, a
promoted replica or an HA successor finds the due keys it inherited on its first pass.

Bounds: one request of at most `max_per_batch` keys in flight at a time (a wave of expiries
spreads over consecutive batches and never grows one beyond that), committed at once
(`Batcher.commit_now`: the producers' writes that share its batch are answered sooner,
none later), a pass at least every
`every_s` (and as soon as the earliest deadline passes, when that comes sooner); the number
of due keys not yet logged is `mercury_expiry_backlog`. Expiries are not producers' writes:
no ACL, no quota; the store takes them off their owner's keys and bytes and counts them in
its `expiries`, and the usage series counts them in the owner's `expiries` column, apart
from deletes (`UsageSeries.add_expiries`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from core import ttl
from core.errors import OverloadedError, ShuttingDownError
from gateway import metrics
from gateway.batcher import Batcher
from store.ops import EXPIRE, Op, Result, Status
from store.store import Store

log = logging.getLogger("mercury.gateway.expirer")

#: The batcher's producer label of expiry requests (no producer may hold this name).
PRODUCER = "(expiry)"
#: The backlog metric counts due keys up to this many (one bounded index walk).
BACKLOG_CAP = 100_000


def expiry_ops(due: list[tuple[bytes, int, int, str]]) -> tuple[list[Op], int]:
    """The EXPIRE ops of `due` keys (key, deadline, seq, owner) and their key + owner bytes
    (what the batcher sizes a request's log entries by)."""
    ops = [Op(EXPIRE, key, b"", owner, seq) for key, _dl, seq, owner in due]
    return ops, sum(len(k) + len(o.encode()) for k, _dl, _s, o in due)


def next_wait(now_us: int, next_deadline_us: int, every_s: float) -> float:
    """Seconds to sleep before the next pass: until the earliest deadline when it comes
    before `every_s`, else `every_s` (at least 1 ms)."""
    if next_deadline_us:
        return max(0.001, min(every_s, (next_deadline_us - now_us) / 1_000_000))
    return every_s


class Expirer:
    """The expirer task of one gateway (start with `start`, stop with `stop`)."""

    def __init__(
        self, store: Store, batcher: Batcher, *, every_s: float = 1.0, max_per_batch: int = 5000
    ) -> None:
        self.store = store
        self.batcher = batcher
        self.every_s = every_s
        self.max_per_batch = max_per_batch
        self._task: asyncio.Task[None] | None = None
        #: Woken early when a write may have brought a deadline sooner than the next pass.
        self._wake = asyncio.Event()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="expirer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while not self.batcher.closing:
            try:
                full = await self.pass_once()
            except ShuttingDownError:
                return
            except OverloadedError:  # the write path is full: the next pass tries again
                full = False
            except Exception:  # a failed commit: logged, retried on the next pass
                log.exception("expiry pass failed")
                full = False
            if full:  # a wave: the next batch of due keys right away
                continue
            now = ttl.now_us()
            wait = next_wait(now, self.store.next_deadline(), self.every_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait)
            self._wake.clear()

    async def pass_once(self) -> bool:
        """Log the expiries of up to `max_per_batch` due keys (waiting for their commit);
        True when there were that many (more may be due)."""
        now = ttl.now_us()
        # One short read transaction of bounded length: on the loop, like a point read.
        due = self.store.due_expiries(now, self.max_per_batch)
        backlog = len(due)
        if backlog >= self.max_per_batch:
            backlog = self.store.expiry_backlog(now, BACKLOG_CAP)
        metrics.EXPIRY_BACKLOG.set(backlog)
        if not due:
            return False
        ops, nbytes = expiry_ops(due)
        fut = self.batcher.submit(ops, nbytes, PRODUCER, counted=False)
        # Due now: committed at once with whatever writes share its batch, not held for
        # the window (which would add up to a window of lateness to each pass).
        self.batcher.commit_now()
        results: list[Result] = await fut
        done = ttl.now_us()
        n = 0
        for (_key, deadline, _seq, _owner), res in zip(due, results, strict=True):
            if res.status == Status.EXPIRED:
                n += 1
                metrics.EXPIRY_LATENESS.observe(max(0.0, (done - deadline) / 1_000_000))
        metrics.EXPIRED.inc(n)
        metrics.EXPIRY_BACKLOG.set(max(0, backlog - len(due)))
        return len(due) >= self.max_per_batch
