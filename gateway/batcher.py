"""Batching: which writes go into one store transaction, and when it commits.

Pure part (no I/O): `coalesce` (several unconditional writes to one key inside one batch:
the last one wins), `key_order` (apply a batch in key order, same statuses) and
`run_order` (the same order by whole requests, when they allow it).
Idempotent answers are built from the store's real results inside the batch's own
transaction (`Store.apply(..., answers=...)`), so a saved answer is what the store did.

Async adapter: `Batcher` collects requests on the event loop; a batch opens with its first
request and commits `window` seconds later, or as soon as it reaches `max_ops` ops or
`max_bytes` bytes. The commit (`store.apply`, one LMDB transaction with fsync) runs in ONE
worker thread so the event loop keeps accepting while it runs; the next batch fills
meanwhile. Each request's future resolves after the durable commit with its own results.

Bounds: a request joins the open batch only while the batch stays within `max_ops`, within
`max_bytes` and within what one log record may hold (`store.format.MAX_LOG_PAYLOAD`; a
request alone may exceed the first two, never the last: 413). A request that does not fit
seals the open batch into a queue of at most `max_queued` batches waiting for the commit
thread and opens a new one; when that queue is full too, the writer is held
(`wait_room`, up to `hold_s`) until a commit makes room, then refused with 503 and
Retry-After (async writes are answered 202 before their commit, so without this a
writer at full speed grew the open batch without limit while a commit ran, up to a log
record no replica accepts). Memory held by waiting writes is thereby at most
(`max_queued` + 1) batches.

Acknowledgement gate (`AckGate`, the root's HA wiring): with one, a committed batch joins a
queue of unacknowledged batches in commit order instead of being answered. `_settle` answers
the queue's head while the gate says so, in one pass: one standby report that confirms N
batches answers all N at once, in the callback that delivered it (the replication link's
transport callback), with no task per batch and no loop turn between two batches. It runs
after each commit, on each gate wake-up and at the head's deadline (a timer), where the gate
answers a batch still unconfirmed with its error. Writers are answered in commit order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import pairwise
from operator import itemgetter
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from core.errors import OverloadedError, ShuttingDownError, TooLargeError
from gateway import metrics
from store.format import MAX_LOG_PAYLOAD, entry_size
from store.ops import DELETE, Op, Result, Status, status_counts
from store.store import Store

if TYPE_CHECKING:
    from gateway.usage_series import UsageSeries

log = logging.getLogger("mercury.gateway.batch")

#: Builds a request's idempotent answer (bytes) from its results.
AnswerFn = Callable[[list[Result]], bytes]

# Field getters for the per-op passes of a batch (`map` runs them in C; a comprehension
# runs a Python step per op, and a bulk load's batches hold 10,000 ops).
_KEY = itemgetter(1)  # Op.key
_STATUS = itemgetter(0)  # Result.status


# --- pure decisions -----------------------------------------------------------------------


def coalesce(ops: Sequence[Op]) -> tuple[list[int], list[int]]:
    """Which ops of a batch to apply, and whose result each op takes.

    Returns (kept, winner): `kept` are indices applied in order; `winner[i]` is the index
    whose result op i reports. An op is dropped only when a later set writes the same key
    and every op on that key is an unconditional set: conditions must see every earlier
    write, and a delete must find what the ops before it left (``set a`` then ``delete a``
    answers written + deleted, as applied one by one, not "absent" for a key just set).
    The final state equals applying every op, for conditions that name committed seqs
    (seqs assigned inside the batch are renumbered by coalescing; no client can know them
    beforehand).
    """
    n = len(ops)
    if len(set(map(_KEY, ops))) == n:  # the common case: every key once
        everything = list(range(n))
        return everything, everything
    last: dict[bytes, int] = {}
    conditional: set[bytes] = set()  # keys never coalesced: a condition or a delete
    for i, op in enumerate(ops):
        last[op.key] = i
        if op.expect_seq is not None or op.op == DELETE:
            conditional.add(op.key)
    kept: list[int] = []
    winner: list[int] = []
    for i, op in enumerate(ops):
        if op.key in conditional or last[op.key] == i:
            kept.append(i)
            winner.append(i)
        else:
            winner.append(last[op.key])
    return kept, winner


def key_order(ops: Sequence[Op]) -> list[int] | None:
    """A stable order of `ops` by key, or None when they are in it already.

    Applying a batch in this order gives every op the same status and leaves the same
    values (each key's ops keep their order, and an op's status depends only on the earlier
    ops of its key); only the seqs the batch assigns are numbered differently, and no client
    can know those beforehand. It lets LMDB append past the last key instead of inserting
    mid-tree: a bulk load whose requests of consecutive keys arrive out of order otherwise
    splits pages half-empty, and its commits slow down as the store grows.
    """
    keys = list(map(_KEY, ops))
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return None if order == list(range(len(keys))) else order


def run_order(runs: Sequence[Sequence[Op]]) -> list[int] | None:
    """An order of the runs (a batch's requests) whose concatenation is the batch in key
    order, or None when there is none (then `key_order` sorts it op by op).

    There is one when every run's keys are in order and the runs' key ranges do not
    overlap, as in a bulk load whose clients each send their own keys in order: applying
    the runs in this order is then exactly applying the ops in `key_order`'s stable order,
    and each request's results stay one contiguous slice — no permutation of every op's
    result (the sort and its inverse cost ~0.15 µs per op of a bulk load). Each check is
    a C-level pass (`sorted` of a sorted list is linear).
    """
    spans: list[tuple[bytes, bytes, int]] = []
    empty: list[int] = []
    for i, ops in enumerate(runs):
        if not ops:
            empty.append(i)
            continue
        keys = list(map(_KEY, ops))
        if keys != sorted(keys):
            return None
        spans.append((keys[0], keys[-1], i))
    spans.sort()
    for (_, hi, _), (lo, _, _) in pairwise(spans):
        if not hi < lo:  # a key of one run between two keys of another, or shared
            return None
    return [i for _, _, i in spans] + empty


def unsort(results: list[Result], order: list[int]) -> list[Result]:
    """Results of ops applied in `order` (from `key_order`), back in the ops' own order."""
    out: list[Result] = [results[0]] * len(results)
    for pos, j in enumerate(order):
        out[j] = results[pos]
    return out


def coalesced_result(won: Result) -> Result:
    """The answer of an op superseded inside its batch by a later write of the same key.

    It was never applied on its own, so it does not claim "written" (a set replaced by a
    duplicate of the stored value leaves no write at all); ``superseded`` at the seq of
    the op that decided the key's outcome says exactly what happened."""
    return Result(Status.SUPERSEDED, won.seq)


def should_flush(n_ops: int, n_bytes: int, max_ops: int, max_bytes: int) -> bool:
    """Whether an open batch is full and must commit before its window ends."""
    return n_ops >= max_ops or n_bytes >= max_bytes


def log_bytes(n_ops: int, nbytes: int, owner: str) -> int:
    """Upper bound of the log payload of `n_ops` ops of `owner` holding `nbytes` bytes of
    keys and values (each op one entry; coalescing only removes entries)."""
    return entry_size(len(owner.encode()), 0, 0) * n_ops + nbytes


def fits(
    batch_ops: int,
    batch_bytes: int,
    batch_log: int,
    n_ops: int,
    nbytes: int,
    nlog: int,
    max_ops: int,
    max_bytes: int,
) -> bool:
    """Whether a request joins a non-empty open batch without passing any of its bounds."""
    return (
        batch_ops + n_ops <= max_ops
        and batch_bytes + nbytes <= max_bytes
        and batch_log + nlog <= MAX_LOG_PAYLOAD
    )


# --- async adapter ------------------------------------------------------------------------


class AckGate(Protocol):
    """What decides when a committed batch's writers may be answered (HA: N standbys have
    applied it and the leadership lease holds)."""

    #: how long a batch may wait for its verdict; asked again at its deadline
    timeout_s: float

    def verdict(self, seq: int, waited_s: float) -> bool | Exception:
        """For the batch ending at `seq`, committed `waited_s` ago: True to answer its
        writers now, False to wait, or the error to answer them with (committed, not
        acknowledged). False only while `waited_s` is under `timeout_s`."""
        ...

    def listen(self, wake: Callable[[], None]) -> None:
        """Call `wake()` on the event loop each time a verdict may have turned."""
        ...


@dataclass(slots=True)
class Request:
    """One HTTP request's ops waiting for a commit."""

    ops: list[Op]
    nbytes: int
    future: asyncio.Future[list[Result]]
    producer: str
    idem_key: bytes | None = None
    answer: AnswerFn | None = None
    #: False for the root's own requests (expiries): not a producer's, so not in a usage
    #: series' producer columns; their expired keys count in their owner's `expiries`
    counted: bool = True


@dataclass(slots=True)
class _Unacked:
    """A committed batch waiting for the gate's verdict."""

    seq: int
    requests: list[Request]
    results: list[list[Result]]
    #: loop time of its commit
    at: float


@dataclass(slots=True)
class _Open:
    requests: list[Request] = field(default_factory=list)
    n_ops: int = 0
    n_bytes: int = 0
    #: upper bound of this batch's log payload (`log_bytes`)
    n_log: int = 0
    deletes: dict[tuple[str, str], int] = field(default_factory=dict)
    opened: float = 0.0


class Batcher:
    """Collects writes and commits them in batches. Use on one event loop.

    `submit` never blocks the loop; its future raises ShuttingDownError once `close` began,
    or the store's error (StoreFullError, StoreError) when the commit failed.
    """

    def __init__(
        self,
        store: Store,
        *,
        window_s: float,
        max_ops: int,
        max_bytes: int,
        max_queued: int = 1,
        hold_s: float = 5.0,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.window_s = window_s
        self.max_ops = max_ops
        self.max_bytes = min(max_bytes, MAX_LOG_PAYLOAD)
        self.max_queued = max_queued
        self.hold_s = hold_s
        #: set (and replaced) after every commit: writers held in `wait_room` look again
        self._room = asyncio.Event()
        #: full batches sealed while a commit ran, committed in order before the open one
        self._queued: deque[_Open] = deque()
        self.on_commit = on_commit
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="mercury-commit")
        self._open = _Open()
        self._throttled: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._full = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        # Read at scrape time: no bookkeeping on the write path.
        metrics.BATCH_WAITING.set_function(self.waiting_requests)
        #: usage over time (`gateway/usage_series.py`): counts each committed request,
        #: and its finished minutes ride in the next batch's transaction as documents
        self.series: UsageSeries | None = None
        #: Asked before a committed batch's writers are answered (`set_ack_gate`); the
        #: commit loop does not wait for it.
        self.ack_gate: AckGate | None = None
        #: committed batches not answered yet, in commit order (only with a gate)
        self._unacked: deque[_Unacked] = deque()
        self._drained = asyncio.Event()
        self._drained.set()
        #: the timer at the head's deadline, and that deadline
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._committed_seq = 0
        #: Until then every batch commits as soon as it opens (`hurry`).
        self._hurry_until = 0.0

    # -- public ---------------------------------------------------------------------------

    def set_ack_gate(self, gate: AckGate) -> None:
        """Answer each committed batch only when `gate` says so (before serving)."""
        self.ack_gate = gate
        gate.listen(self._settle)

    def start(self) -> None:
        """Start the commit loop (on the running event loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="batcher")

    def hurry(self, seconds: float = float("inf")) -> None:
        """Commit the open batch now, and each one opened in the next `seconds` as soon as
        it opens (window 0). The old root of a hand-over (`kill -USR2`) hurries for good:
        the new root, with every writer, waits for its last answers; the new one hurries
        for a window: its first writers already waited through the switch."""
        self._hurry_until = time.monotonic() + seconds
        if self._open.requests:
            self._full.set()
            self._wake.set()

    def commit_now(self) -> None:
        """Commit the open batch without waiting for the rest of its window (the expirer:
        a due expiry is not held for more writes to join it). Unlike `hurry`, later
        batches keep their window."""
        if self._open.requests:
            self._full.set()
            self._wake.set()

    async def close(self) -> None:
        """Stop accepting, commit the open batch (acknowledging it), stop the loop."""
        self._closing = True
        self._wake.set()
        self._full.set()
        if self._task is not None:
            await self._task
        if self.series is not None:  # the open minute too: a clean stop loses no counts
            await asyncio.get_running_loop().run_in_executor(self.executor, self._flush_series)
        self.executor.shutdown(wait=True)

    def _flush_series(self) -> None:
        assert self.series is not None
        changes = self.series.due(time.time(), self._usage_snapshot, all_=True)
        if changes:
            self.store.put_docs(changes)
            self.series.written(changes)

    def _usage_snapshot(self) -> dict[str, tuple[int, int]]:
        return {name: (u.keys, u.bytes) for name, u in self.store.usage().items()}

    @property
    def closing(self) -> bool:
        """Whether `close` has begun (new writes are refused with 503)."""
        return self._closing

    def waiting_requests(self) -> int:
        """Requests admitted to the open batch or to a sealed batch still queued."""
        return len(self._open.requests) + sum(len(b.requests) for b in self._queued)

    def open_deletes(self, producer: str, keyspace: str) -> int:
        """Deletes of `producer` under `keyspace` already in the open batch (write guard)."""
        return self._open.deletes.get((producer, keyspace), 0)

    def has_room(self, n_ops: int, nbytes: int, producer: str) -> bool:
        """Whether `submit` would take a request of this size now (without a refusal)."""
        b = self._open
        return (
            not b.requests
            or len(self._queued) < self.max_queued
            or fits(
                b.n_ops,
                b.n_bytes,
                b.n_log,
                n_ops,
                nbytes,
                log_bytes(n_ops, nbytes, producer),
                self.max_ops,
                self.max_bytes,
            )
        )

    async def wait_room(self, n_ops: int, nbytes: int, producer: str) -> None:
        """Hold a writer while the open batch and the queue of full ones are both full,
        for at most `hold_s`: the backpressure async writers feel. Returns either way;
        `submit` (called with no await in between) refuses with 503 if still full."""
        if self.has_room(n_ops, nbytes, producer):
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.hold_s
        while not self._closing and not self.has_room(n_ops, nbytes, producer):
            left = deadline - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), left)

    def submit(
        self,
        ops: list[Op],
        nbytes: int,
        producer: str,
        *,
        idem_key: bytes | None = None,
        answer: AnswerFn | None = None,
        deletes: dict[str, int] | None = None,
        counted: bool = True,
    ) -> asyncio.Future[list[Result]]:
        """Queue a request's ops for the open batch; the future gives one Result per op.
        `counted=False`: not a producer's request (the expirer's), left out of usage series."""
        if self._closing:
            raise ShuttingDownError("the gateway is shutting down", hint="retry on the new root")
        nlog = log_bytes(len(ops), nbytes, producer)
        if nlog > MAX_LOG_PAYLOAD:  # can never succeed: not a retryable refusal
            raise TooLargeError(
                f"request of {len(ops)} ops and {nbytes} bytes would make a log record "
                f"beyond {MAX_LOG_PAYLOAD} bytes",
                hint="send it as several requests",
            )
        b = self._open
        if b.requests and not fits(
            b.n_ops, b.n_bytes, b.n_log, len(ops), nbytes, nlog, self.max_ops, self.max_bytes
        ):
            if len(self._queued) >= self.max_queued:
                metrics.BATCH_OVERLOADED.inc()
                wait = max(1, round(self.window_s + 0.5))
                raise OverloadedError(
                    f"the write path holds {len(self._queued) + 1} full batches waiting "
                    "for their commit",
                    hint=f"retry after {wait} s",
                    headers={"Retry-After": str(wait)},
                )
            self._queued.append(b)
            self._open = b = _Open()
            self._full.set()
        fut: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        if not b.requests:
            b.opened = time.monotonic()
            self._wake.set()
        b.requests.append(Request(ops, nbytes, fut, producer, idem_key, answer, counted))
        b.n_ops += len(ops)
        b.n_bytes += nbytes
        b.n_log += nlog
        if deletes:
            for ks, n in deletes.items():
                b.deletes[(producer, ks)] = b.deletes.get((producer, ks), 0) + n
        if should_flush(b.n_ops, b.n_bytes, self.max_ops, self.max_bytes):
            self._full.set()
        return fut

    def note_throttled(self, producer: str, n: int) -> None:
        """Count `n` throttled ops of `producer` (stored with the next batch)."""
        self._throttled[producer] = self._throttled.get(producer, 0) + n
        if not self._open.requests:
            self._open.opened = time.monotonic()
            self._wake.set()

    # -- loop -----------------------------------------------------------------------------

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            b = self._open
            if not self._closing and not self._queued:
                now = time.monotonic()
                window = 0.0 if now < self._hurry_until else self.window_s
                remaining = b.opened + window - now
                if remaining > 0 and not self._full.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._full.wait(), remaining)
            if self._queued:  # sealed full while the last commit ran: first in, first out
                b = self._queued.popleft()
            else:
                b = self._open
                self._open = _Open()
            throttled, self._throttled = self._throttled, {}
            self._signal_room()  # one batch fewer waiting: held writers look again
            nxt = self._open
            if not self._queued and not nxt.requests:
                self._wake.clear()
            if not self._queued and not should_flush(
                nxt.n_ops, nxt.n_bytes, self.max_ops, self.max_bytes
            ):
                self._full.clear()
            if b.requests or throttled:
                try:
                    results = await loop.run_in_executor(
                        self.executor, self._commit, b.requests, throttled
                    )
                except Exception as err:  # the store's error goes to every waiting request
                    log.error("batch commit failed: %s", err)
                    for r in b.requests:
                        if not r.future.done():
                            r.future.set_exception(err)
                else:
                    if self.ack_gate is not None:
                        self._unacked.append(
                            _Unacked(self._committed_seq, b.requests, results, loop.time())
                        )
                        self._drained.clear()
                        self._settle()
                    else:
                        _answer(b.requests, results)
                    if self.series is not None:  # here, not in the commit thread: counting
                        # then overlaps the next commit's fsync instead of delaying it; and
                        # after the woken writers' answers (call_soon runs behind them)
                        reqs, res, exp_ops, exp_res = _counted(b.requests, results)
                        now = time.time()
                        loop.call_soon(self.series.add_requests, reqs, res, now)
                        if exp_ops:
                            loop.call_soon(self.series.add_expiries, exp_ops, exp_res, now)
            self._signal_room()  # the open batch moved on
            if self._closing and not self._open.requests and not self._queued:
                await self._drained.wait()  # every committed batch answered (or refused)
                return

    def _settle(self) -> None:
        """Answer every committed batch the gate lets go, from the oldest, in one pass;
        stop at the first it holds (commit order), and be back at that one's deadline."""
        gate = self.ack_gate
        q = self._unacked
        if gate is None or not q:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        while q:
            head = q[0]
            verdict = gate.verdict(head.seq, now - head.at)
            if verdict is False:
                break
            q.popleft()
            metrics.BATCH_ACK_WAIT.observe(now - head.at)
            if verdict is True:
                _answer(head.requests, head.results)
            else:  # committed, not acknowledged: the gate's error says so
                for r in head.requests:
                    if not r.future.done():
                        r.future.set_exception(verdict)
        if not q:
            self._drained.set()
            return
        due = q[0].at + gate.timeout_s
        if self._timer is None or self._timer_at != due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = due
            self._timer = loop.call_at(due, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        self._settle()

    def _signal_room(self) -> None:
        room, self._room = self._room, asyncio.Event()
        room.set()

    def _commit(self, requests: list[Request], throttled: dict[str, int]) -> list[list[Result]]:
        """Runs in the worker thread: one `store.apply` for the whole batch."""
        ops: list[Op] = []
        for r in requests:
            ops += r.ops
        kept, winner = coalesce(ops)
        runs = run_order([r.ops for r in requests]) if len(kept) == len(ops) else None
        order: list[int] | None = None
        applied: list[Op]
        if runs is not None:  # whole requests in key order: results are slices
            applied = []
            starts = [0] * len(requests)
            for i in runs:
                starts[i] = len(applied)
                applied += requests[i].ops

            def per_request(res: list[Result]) -> list[list[Result]]:
                return [res[a : a + len(r.ops)] for a, r in zip(starts, requests, strict=True)]

        else:
            applied = [ops[i] for i in kept]
            order = key_order(applied)
            if order is not None:
                applied = [applied[j] for j in order]

            def per_request(res: list[Result]) -> list[list[Result]]:
                res = res if order is None else unsort(res, order)
                return _split(requests, _spread(ops, kept, winner, res))

        def answers(applied_results: list[Result]) -> list[tuple[bytes, bytes]]:
            # Called by the store inside the batch transaction with its real results.
            per_req = per_request(applied_results)
            return [
                (r.idem_key, r.answer(rs))
                for r, rs in zip(requests, per_req, strict=True)
                if r.idem_key is not None and r.answer is not None
            ]

        wants_answers = any(r.idem_key is not None for r in requests)
        series = self.series
        changes = None
        if series is not None:
            producers = {r.producer for r in requests if r.counted}
            changes = series.due(time.time(), self._usage_snapshot, starting=producers)
        t0 = time.perf_counter()
        out = self.store.apply(
            applied,
            throttled=throttled,
            answers=answers if wants_answers else None,
            doc_changes=changes or None,
        )
        dt = time.perf_counter() - t0
        metrics.BATCH_COMMIT.observe(dt)
        metrics.BATCH_OPS.observe(len(applied))
        # What the ack gate waits for (a batch of duplicates only writes no record: its
        # answers still rest on the state up to the current head).
        self._committed_seq = out.last_seq or self.store.last_seq()
        split = per_request(out.results)
        if series is not None and changes:
            series.written(changes)
        _log_batch(requests, split, out.first_seq, out.last_seq, len(applied), dt)
        if self.on_commit is not None:
            self.on_commit()
        return split


def _counted(
    requests: list[Request], results: list[list[Result]]
) -> tuple[list[Request], list[list[Result]], list[Op], list[Result]]:
    """The producers' requests of a batch with their results, and apart from them the
    expirer's ops with theirs (counted as their owners' expiries, never as requests)."""
    if all(r.counted for r in requests):
        return requests, results, [], []
    pairs = [(r, x) for r, x in zip(requests, results, strict=True) if r.counted]
    exp_ops: list[Op] = []
    exp_res: list[Result] = []
    for r, x in zip(requests, results, strict=True):
        if not r.counted:
            exp_ops.extend(r.ops)
            exp_res.extend(x)
    return [r for r, _ in pairs], [x for _, x in pairs], exp_ops, exp_res


def _answer(requests: list[Request], results: list[list[Result]]) -> None:
    for r, res in zip(requests, results, strict=True):
        if not r.future.done():
            r.future.set_result(res)


def _spread(
    ops: list[Op], kept: list[int], winner: list[int], results: list[Result]
) -> list[Result]:
    """Results of the applied ops spread back over every op of the batch."""
    if len(kept) == len(ops):  # nothing coalesced: results are already in op order
        return results
    by_index = dict(zip(kept, results, strict=True))
    out = []
    for i in range(len(ops)):
        w = winner[i]
        out.append(by_index[i] if w == i else coalesced_result(by_index[w]))
    return out


def _split(requests: list[Request], per_op: list[Result]) -> list[list[Result]]:
    out = []
    pos = 0
    for r in requests:
        n = len(r.ops)
        out.append(per_op[pos : pos + n])
        pos += n
    return out


def _log_batch(
    requests: list[Request],
    split: list[list[Result]],
    first: int,
    last: int,
    applied: int,
    dt: float,
) -> None:
    """One structured line per batch: seqs and, per producer, how many of each result."""
    # One count per producer over its status column (a Counter per request cost ~2 µs
    # each: milliseconds per batch of single-key PUTs, in the commit thread, before any ack).
    statuses: dict[str, list[Status]] = {}
    for r, res in zip(requests, split, strict=True):
        col = statuses.get(r.producer)
        if col is None:
            col = statuses[r.producer] = []
        col += map(_STATUS, res)
    per: dict[str, dict[str, int]] = {
        producer: {st.value: n for st, n in status_counts(col).items()}
        for producer, col in statuses.items()
    }
    for producer, counts in per.items():
        for status, n in counts.items():
            metrics.WRITE_OPS.labels(producer, status).inc(n)
    if log.isEnabledFor(logging.DEBUG):  # one line per request (--log-level debug)
        for r, res in zip(requests, split, strict=True):
            for op, x in zip(r.ops, res, strict=True):
                log.debug(
                    orjson.dumps(
                        {
                            "event": "write",
                            "producer": r.producer,
                            "key": op.key.decode("utf-8", "backslashreplace"),
                            "seq": x.seq,
                            "result": x.status.value,
                        }
                    ).decode()
                )
    # A commit of throttle counters only (429s, no request) is not a batch: no line.
    if requests and log.isEnabledFor(logging.INFO):
        doc: dict[str, Any] = {
            "event": "batch",
            "first_seq": first,
            "last_seq": last,
            "requests": len(requests),
            "applied_ops": applied,
            "commit_ms": round(dt * 1000, 3),
            "producers": per,
        }
        log.info(orjson.dumps(doc).decode())
