"""The gateway's state and write path: auth, ACL, guards, quotas, idempotency, batching.

`Gateway` lives on ``app.state.gw`` (one per app, built in the lifespan). Its methods are
called by the routes on the event loop; nothing here blocks the loop: store writes run in
the batcher's worker thread, quota holds are `asyncio.sleep`s of the held request only (a
held producer never delays another).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from acl.model import STATE_KEY, Acl, Producer, find_token
from acl.tokens import hash_token
from core.errors import (
    AuthError,
    BadRequestError,
    ForbiddenError,
    MercuryError,
    QuotaExceededError,
    StorageQuotaError,
    WriteGuardError,
)
from gateway import metrics
from gateway.batcher import Batcher
from gateway.quota import Bucket, ProducerBuckets
from gateway.settings import Settings
from store.ops import DELETE, SET, Op, Result, Status
from store.store import Store
from store.usage import Usage, stored_bytes

log = logging.getLogger("mercury.gateway")
ADMIN = "\x00admin"  # never a producer name (names cannot hold NUL)
#: Longest Idempotency-Key: with the producer name (≤ 255 bytes) it must fit an LMDB key.
MAX_IDEMPOTENCY_KEY = 200
REPLAYED = {"Idempotent-Replayed": "true"}


@dataclass(slots=True)
class Answer:
    """An HTTP answer of the write path: status, JSON body, extra headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str]


class Gateway:
    """Everything a gateway process holds in memory, rebuilt from the store at start."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        raw = store.get_state(STATE_KEY)
        self.acl = Acl.from_json(orjson.loads(raw)) if raw else Acl()
        admin = store.get_state("admin_token_hash")
        self.admin_hash = admin.decode() if admin else None
        self._index = self.acl.token_index()
        self._prefixes: dict[str, tuple[bytes, ...]] = {}
        self._buckets: dict[str, ProducerBuckets] = {}
        self._inflight: dict[bytes, asyncio.Future[Answer]] = {}
        #: Per producer with a storage quota: growth of its admitted, uncommitted writes.
        self._pending_growth: dict[str, int] = {}
        self.usage: dict[str, Usage] = store.usage()
        self.batcher = Batcher(
            store,
            window_s=settings.batch_window_ms / 1000.0,
            max_ops=settings.batch_max_ops,
            max_bytes=settings.batch_max_bytes,
            on_commit=self._refresh_usage,
        )
        self._gc_task: asyncio.Task[None] | None = None
        self._rebuild()

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the batcher and the idempotency GC (on the running loop)."""
        self.batcher.start()
        self._gc_task = asyncio.get_running_loop().create_task(self._gc_loop(), name="idem-gc")

    async def stop(self) -> None:
        """Commit and acknowledge the open batch, stop background tasks."""
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        await self.batcher.close()

    async def _gc_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            cutoff = int((time.time() - self.settings.idempotency_ttl_s) * 1e6)
            try:
                await loop.run_in_executor(self.batcher.executor, self.store.gc_idempotency, cutoff)
            except MercuryError as err:  # the next round retries
                log.warning("idempotency GC failed: %s", err)
            await asyncio.sleep(self.settings.idempotency_gc_every_s)

    def _refresh_usage(self) -> None:
        """After each commit (worker thread): usage counters for quotas and metrics."""
        self.usage = usage = self.store.usage()
        for name, u in usage.items():
            metrics.USAGE_BYTES.labels(name).set(u.bytes)
            metrics.USAGE_KEYS.labels(name).set(u.keys)

    # --- ACL ----------------------------------------------------------------------------

    def _rebuild(self) -> None:
        self._index = self.acl.token_index()
        self._prefixes = {n: p.prefixes() for n, p in self.acl.producers.items()}
        now = time.monotonic()
        buckets = {}
        for name, p in self.acl.producers.items():
            q = p.quota
            old = self._buckets.get(name)
            ops = Bucket.full(q.ops_per_s, q.burst or q.ops_per_s, now) if q.ops_per_s else None
            nb = (
                Bucket.full(q.bytes_per_s, q.bytes_burst or q.bytes_per_s, now)
                if q.bytes_per_s
                else None
            )
            # Keep the current balance across a config change so a change never refills.
            if old is not None and old.ops is not None and ops is not None:
                ops.tokens = min(ops.burst, old.ops.tokens)
            if old is not None and old.bytes is not None and nb is not None:
                nb.tokens = min(nb.burst, old.bytes.tokens)
            buckets[name] = ProducerBuckets(ops, nb)
        self._buckets = buckets

    async def set_acl(self, acl: Acl) -> None:
        """Persist a new ACL (in the commit thread, serialised with batches) and use it."""
        doc = orjson.dumps(acl.to_json())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.batcher.executor, self.store.put_state, STATE_KEY, doc)
        self.acl = acl
        self._rebuild()

    def authenticate(self, authorization: str | None) -> str:
        """Producer name (or ADMIN) of a ``Bearer`` header; AuthError when unknown."""
        if not authorization or not authorization[:7].lower() == "bearer ":
            raise AuthError("missing bearer token", hint='send "Authorization: Bearer <token>"')
        token = authorization[7:].strip()
        hit = find_token(self._index, token)
        if hit is not None:
            return hit[0]
        if self.admin_hash is not None and hmac.compare_digest(hash_token(token), self.admin_hash):
            return ADMIN
        raise AuthError("unknown or revoked token")

    def require_admin(self, authorization: str | None) -> None:
        """Raise unless the caller holds the admin token."""
        if self.authenticate(authorization) != ADMIN:
            raise ForbiddenError("this call needs the admin token")

    def producer(self, authorization: str | None) -> Producer:
        """The calling producer (ForbiddenError for the admin token on producer calls)."""
        name = self.authenticate(authorization)
        if name == ADMIN:
            raise ForbiddenError(
                "the admin token cannot write keys", hint="create a producer and use its token"
            )
        return self.acl.producers[name]

    def check_keys(self, p: Producer, ops: list[Op]) -> None:
        """Every op's key must lie in `p`'s keyspaces (all checked before any applies)."""
        prefixes = self._prefixes.get(p.name, ())
        # key.startswith(tuple) inlined: this check runs once per op of every request
        bad = next((op for op in ops if not (prefixes and op.key.startswith(prefixes))), None)
        if bad is not None:
            raise ForbiddenError(
                f"key {bad.key.decode('utf-8', 'backslashreplace')!r} is outside the "
                f"keyspaces of producer {p.name!r}: {list(p.keyspaces)}",
                producer=p.name,
                key=bad.key,
                keyspaces=list(p.keyspaces),
            )

    def check_guards(self, p: Producer, ops: list[Op]) -> dict[str, int]:
        """Apply `p`'s keyspace write guards; return deletes per guarded keyspace."""
        if not p.guards:
            return {}
        deletes: dict[str, int] = {}
        guards = [(ks.encode(), ks, g) for ks, g in p.guards.items()]
        for op in ops:
            for prefix, ks, g in guards:
                if not op.key.startswith(prefix):
                    continue
                if op.op == SET and g.refuse_empty and not op.value:
                    raise WriteGuardError(
                        f"keyspace {ks!r} refuses empty values (key {op.key!r})",
                        producer=p.name,
                        keyspace=ks,
                    )
                if op.op == DELETE and g.max_deletes_per_batch is not None:
                    deletes[ks] = deletes.get(ks, 0) + 1
        for ks, n in deletes.items():
            cap = p.guards[ks].max_deletes_per_batch
            total = n + self.batcher.open_deletes(p.name, ks)
            if cap is not None and total > cap:
                raise WriteGuardError(
                    f"keyspace {ks!r} allows at most {cap} deletes per batch; this request "
                    f"would make {total}",
                    producer=p.name,
                    keyspace=ks,
                    hint="delete in smaller steps",
                )
        return deletes

    def check_storage(self, p: Producer, ops: list[Op]) -> int:
        """507 when the sets would grow `p`'s stored bytes beyond its storage quota.

        Counts what the store holds plus the growth of `p`'s writes admitted but not yet
        committed (the open batch and the one committing), so a burst inside one window
        cannot overshoot. Returns this request's growth, which the caller reserves with
        `_reserve` until its batch is committed.
        """
        limit = p.quota.max_bytes_stored
        if limit is None:
            return 0
        used = self.usage.get(p.name, Usage()).bytes + self._pending_growth.get(p.name, 0)
        owner_len = len(p.name.encode())
        growth = 0
        for op in ops:
            if op.op != SET:
                continue
            new = stored_bytes(len(op.key), len(op.value), owner_len)
            old = self.store.get(op.key)
            growth += new - (
                stored_bytes(len(op.key), len(old.value), len(old.owner.encode())) if old else 0
            )
        if growth > 0 and used + growth > limit:
            raise StorageQuotaError(
                f"producer {p.name!r} stores {used} bytes (writes not yet committed "
                f"included); this write adds {growth} and its storage quota is {limit}",
                producer=p.name,
                hint="delete keys or raise max_bytes_stored",
            )
        return max(0, growth)

    def _reserve(self, producer: str, growth: int) -> None:
        """Add (or, negative, release) growth admitted under a storage quota."""
        if growth:
            left = self._pending_growth.get(producer, 0) + growth
            if left:
                self._pending_growth[producer] = left
            else:
                self._pending_growth.pop(producer, None)

    # --- quota ------------------------------------------------------------------------------

    def rate_headers(self, p: Producer) -> dict[str, str]:
        """RateLimit-Policy / RateLimit headers (IETF draft syntax) of `p`'s quota."""
        b = self._buckets.get(p.name)
        q = p.quota
        if b is None or (b.ops is None and b.bytes is None):
            return {}
        pol, cur = [], []
        if b.ops is not None and q.ops_per_s:
            pol.append(f'"ops";q={int(b.ops.burst)};w=1')
            left = max(0, int(b.ops.tokens))
            reset = max(0.0, (b.ops.burst - b.ops.tokens) / b.ops.rate)
            cur.append(f'"ops";r={left};t={math.ceil(reset)}')
        if b.bytes is not None and q.bytes_per_s:
            pol.append(f'"bytes";q={int(b.bytes.burst)};w=1')
            left = max(0, int(b.bytes.tokens))
            reset = max(0.0, (b.bytes.burst - b.bytes.tokens) / b.bytes.rate)
            cur.append(f'"bytes";r={left};t={math.ceil(reset)}')
        return {"RateLimit-Policy": ", ".join(pol), "RateLimit": ", ".join(cur)}

    async def admit(self, p: Producer, n_ops: int, n_bytes: int) -> dict[str, str]:
        """Hold the request until `p`'s quota admits it; 429 beyond max_delay_ms.

        Returns the headers a throttled answer carries (empty when not throttled).
        """
        b = self._buckets.get(p.name)
        if b is None or (b.ops is None and b.bytes is None):
            return {}
        q = p.quota
        d = b.take(time.monotonic(), n_ops, n_bytes, q.max_delay_ms / 1000.0)
        if not d.excess:
            return {}
        self.batcher.note_throttled(p.name, n_ops)
        if q.shadow:
            return {}  # counted, not enforced
        headers = self.rate_headers(p)
        if not d.admitted:
            retry = max(1, math.ceil(d.retry_after))
            headers["Retry-After"] = str(retry)
            metrics.WRITE_OPS.labels(p.name, "throttled").inc(n_ops)
            raise QuotaExceededError(
                f"producer {p.name!r} is over its write quota; retry after {retry} s",
                producer=p.name,
                retry_after=retry,
                headers=headers,
            )
        metrics.QUOTA_DELAY.labels(p.name).observe(d.delay)
        await asyncio.sleep(d.delay)
        return headers

    # --- writes -------------------------------------------------------------------------

    async def write(
        self,
        p: Producer,
        ops: list[Op],
        nbytes: int,
        answer: Callable[[list[Result]], Answer],
        *,
        idem: str | None = None,
        is_async: bool = False,
        t0: float | None = None,
    ) -> Answer:
        """The write path of one request (ops already parsed and size-checked): ACL,
        guards, storage quota, quota hold, batch, answer after the durable commit.

        With `idem` (an Idempotency-Key) a retry gets the first answer: from the store
        when that request committed, or by waiting for it while it is in flight.
        """
        t0 = t0 if t0 is not None else time.perf_counter()
        if idem is None:
            return await self._write(p, ops, nbytes, answer, None, is_async, t0)
        if not idem or len(idem.encode("utf-8", "surrogatepass")) > MAX_IDEMPOTENCY_KEY:
            raise BadRequestError(
                f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} bytes, got {len(idem)}"
            )
        key = b"i" + p.name.encode() + b"\x00" + idem.encode("utf-8", "surrogatepass")
        waiting = self._inflight.get(key)
        if waiting is not None:
            first = await asyncio.shield(waiting)
            return Answer(first.status, first.body, {**first.headers, **REPLAYED})
        stored = self.store.get_idempotent(key)
        if stored is not None:
            doc = orjson.loads(stored[1])
            return Answer(doc["status"], doc["body"], dict(REPLAYED))
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            ans = await self._write(p, ops, nbytes, answer, key, is_async, t0)
        except BaseException as err:
            fut.set_exception(err)
            fut.exception()  # marks it retrieved; waiters re-raise it themselves
            raise
        else:
            fut.set_result(ans)
            return ans
        finally:
            del self._inflight[key]

    async def _write(
        self,
        p: Producer,
        ops: list[Op],
        nbytes: int,
        answer: Callable[[list[Result]], Answer],
        idem_key: bytes | None,
        is_async: bool,
        t0: float,
    ) -> Answer:
        self.check_keys(p, ops)
        deletes = self.check_guards(p, ops)
        growth = self.check_storage(p, ops)
        # Reserved until the batch is committed (the usage counters then hold it) or the
        # request is refused; no await between the check and the reservation.
        self._reserve(p.name, growth)
        try:
            headers = await self.admit(p, len(ops), nbytes)

            def stored_answer(results: list[Result]) -> bytes:
                a = answer(results)
                return orjson.dumps({"status": a.status, "body": a.body})

            fut = self.batcher.submit(
                ops,
                nbytes,
                p.name,
                idem_key=idem_key,
                answer=stored_answer if idem_key is not None else None,
                deletes=deletes,
            )
        except BaseException:
            self._reserve(p.name, -growth)
            raise
        if growth:
            fut.add_done_callback(lambda _f: self._reserve(p.name, -growth))
        if is_async:
            fut.add_done_callback(_retrieve)
            return Answer(202, {"status": "accepted", "ops": len(ops)}, headers)
        results = await fut
        metrics.WRITE_ACK.labels(p.name).observe(time.perf_counter() - t0)
        a = answer(results)
        if headers:
            a.headers.update(headers)
        return a


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Done-callback of async writes: consume the outcome (errors are logged by the batcher)."""
    if not fut.cancelled():
        fut.exception()


def kv_answer(results: list[Result]) -> Answer:
    """Answer of a single-key PUT/DELETE from its one result (412 on a failed condition)."""
    r = results[0]
    if r.status is Status.PRECONDITION_FAILED:
        body = {
            "type": "https://mercury.invalid/problems/precondition-failed",
            "title": "Precondition Failed",
            "status": 412,
            "detail": f"condition failed: the key's current seq is {r.seq}",
            "current_seq": r.seq,
        }
        return Answer(412, body, {"ETag": f'"{r.seq}"'} if r.seq else {})
    return Answer(200, {"seq": r.seq, "status": r.status.value}, {})


def batch_answer(results: list[Result]) -> Answer:
    """Answer of POST /v1/batch: counts and the highest seq it touched."""
    counts = Counter([r[0] for r in results])
    seq = max([r[1] for r in results], default=0)
    written = counts[Status.WRITTEN]
    deleted = counts[Status.DELETED]
    dups = counts[Status.DUPLICATE]
    absent = counts[Status.ABSENT]
    return Answer(
        200,
        {"seq": seq, "written": written, "deleted": deleted, "duplicates": dups, "absent": absent},
        {},
    )
