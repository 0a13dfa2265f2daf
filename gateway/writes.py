"""The gateway's state and the write path that composes auth, guards, the storage quota,
admission (rate quota), idempotency and batching.

`Gateway` lives on ``app.state.gw`` (one per app, built in the lifespan). Its methods are
called by the routes on the event loop; nothing here blocks the loop: store writes run in
the batcher's worker thread, quota holds are `asyncio.sleep`s of the held request only.
Each concept lives in its own module (`auth`, `guards`, `storage_quota`, `admission`,
`idempotency`, `answers`); this one only orders them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from acl.model import Acl, Producer
from core.errors import AuthError
from gateway import aclstore, idempotency, metrics, usage_metrics, usage_series
from gateway.admission import Admission
from gateway.answers import Answer, batch_answer, kv_answer
from gateway.auth import ADMIN, Auth, load_admin_hash
from gateway.batcher import Batcher
from gateway.expirer import Expirer
from gateway.guards import check_guards
from gateway.idempotency import MAX_IDEMPOTENCY_KEY, REPLAYED, Hold, Idempotency
from gateway.settings import Settings
from gateway.storage_quota import StorageQuota
from store.ops import Op, Result
from store.store import Store
from store.usage import Usage

__all__ = [
    "ADMIN",
    "MAX_IDEMPOTENCY_KEY",
    "REPLAYED",
    "Answer",
    "Gateway",
    "batch_answer",
    "kv_answer",
]


class Gateway:
    """Everything a gateway process holds in memory, rebuilt from the store at start."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self.store = store
        self.settings = settings
        acl, _version = aclstore.load(store)
        self.auth = Auth(acl, load_admin_hash(store))
        self.usage: dict[str, Usage] = store.usage()
        self.batcher = Batcher(
            store,
            window_s=settings.batch_window_ms / 1000.0,
            max_ops=settings.batch_max_ops,
            max_bytes=settings.batch_max_bytes,
            on_commit=self._refresh_usage,
        )
        self.admission = Admission(acl, self.batcher.note_throttled)
        self.series = usage_series.for_store(store, self._keyspaces, lambda: self.admission.counts)
        self.batcher.series = self.series
        usage_metrics.bind(lambda: self.usage)
        self.storage = StorageQuota(store)
        # Read from the store at each scrape: set by the batcher it read 0 after a restart
        # until the first batch, and missed what is committed beside it (the ACL, purges).
        metrics.LOG_LAST_SEQ.set_function(store.last_seq)
        self.idempotency = Idempotency(store, settings.idempotency_ttl_s)
        self._gc_task: asyncio.Task[None] | None = None
        #: The root's expirer (`gateway/expirer.py`): logs the expiry of each due key.
        self.expirer = Expirer(
            store,
            self.batcher,
            every_s=settings.expiry_every_s,
            max_per_batch=settings.expiry_batch_max,
        )
        #: Each producer's submitted writes not yet committed (or refused): `settled`.
        self._pending: dict[str, set[asyncio.Future[list[Result]]]] = {}
        #: Producers being purged: their writes are refused at submit (`fence`).
        self._fenced: set[str] = set()

    def _keyspaces(self, producer: str) -> tuple[str, ...]:
        p = self.acl.producers.get(producer)
        return p.keyspaces if p is not None else ()

    @property
    def acl(self) -> Acl:
        """The ACL in force."""
        return self.auth.acl

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start the batcher and the idempotency GC (on the running loop)."""
        self.batcher.start()
        s = self.settings
        self._gc_task = asyncio.get_running_loop().create_task(
            idempotency.gc_loop(
                self.store, self.batcher.executor, s.idempotency_ttl_s, s.idempotency_gc_every_s
            ),
            name="idem-gc",
        )
        self.expirer.start()

    async def stop(self) -> None:
        """Commit and acknowledge the open batch, stop background tasks."""
        await self.expirer.stop()
        if self._gc_task is not None:
            self._gc_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._gc_task
        await self.batcher.close()

    def _refresh_usage(self) -> None:
        """After each commit (worker thread): usage counters for quotas and metrics."""
        self.usage = usage = self.store.usage()
        for name, u in usage.items():
            metrics.USAGE_BYTES.labels(name).set(u.bytes)
            metrics.USAGE_KEYS.labels(name).set(u.keys)

    # --- ACL ----------------------------------------------------------------------------

    async def set_acl(self, acl: Acl, change: aclstore.Change | None = None) -> int:
        """Commit a new ACL and the audit record of `change` through the log (in the
        commit thread, serialised with batches), use it, and return its version."""
        loop = asyncio.get_running_loop()
        version = await loop.run_in_executor(
            self.batcher.executor, aclstore.commit, self.store, acl, change
        )
        self.auth.rebuild(acl)
        self.admission.rebuild(acl)
        return version

    async def set_admin_hash(self, admin_hash: str, change: aclstore.Change) -> None:
        """Commit the admin token's new hash (in the commit thread, serialised with
        batches) and check admin calls against it from the next request on."""
        await asyncio.get_running_loop().run_in_executor(
            self.batcher.executor, aclstore.commit_admin_hash, self.store, admin_hash, change
        )
        self.auth.admin_hash = admin_hash

    def authenticate(self, authorization: str | None) -> str:
        """Producer name (or ADMIN) of a ``Bearer`` header; AuthError when unknown."""
        return self.auth.authenticate(authorization)

    def require_admin(self, authorization: str | None) -> None:
        """Raise unless the caller holds the admin token."""
        self.auth.require_admin(authorization)

    def producer(self, authorization: str | None) -> Producer:
        """The calling producer (ForbiddenError for the admin token on producer calls)."""
        return self.auth.producer(authorization)

    def check_keys(self, p: Producer, ops: list[Op]) -> None:
        """Every op's key must lie in `p`'s keyspaces (all checked before any applies)."""
        self.auth.check_keys(p, ops)

    # --- writes -------------------------------------------------------------------------

    async def write(
        self,
        p: Producer,
        ops: list[Op],
        nbytes: int,
        answer: Callable[[list[Result]], Answer],
        *,
        idem: str | None = None,
        fp: str = "",
        is_async: bool = False,
        t0: float | None = None,
    ) -> Answer:
        """The write path of one request (ops already parsed and size-checked): ACL,
        guards, storage quota, quota hold, batch, answer after the durable commit.

        With `idem` (an Idempotency-Key) a retry gets the first answer: from the store
        when that request committed, or by waiting for it while it is in flight; `fp` is
        the request's fingerprint (`idempotency.fingerprint`): a different request with
        the same key gets 422.
        """
        t0 = t0 if t0 is not None else time.perf_counter()
        if idem is None:
            return await self._write(p, ops, nbytes, answer, None, fp, is_async, t0, None)
        key = idempotency.store_key(p.name, idem)
        return await self.idempotency.once(
            key,
            idem,
            fp,
            lambda hold: self._write(p, ops, nbytes, answer, key, fp, is_async, t0, hold),
        )

    async def _write(
        self,
        p: Producer,
        ops: list[Op],
        nbytes: int,
        answer: Callable[[list[Result]], Answer],
        idem_key: bytes | None,
        fp: str,
        is_async: bool,
        t0: float,
        hold: Hold | None,
    ) -> Answer:
        self.auth.check_keys(p, ops)
        deletes = check_guards(p, ops, self.batcher.open_deletes)
        growth = self.storage.check(p, ops, self.usage)
        # Reserved until the batch is committed (the usage counters then hold it) or the
        # request is refused; no await between the check and the reservation.
        self.storage.reserve(p.name, growth)
        try:
            headers = await self.admission.admit(p, len(ops), nbytes)
            await self.batcher.wait_room(len(ops), nbytes, p.name)  # held while full
            # Authenticated when its headers arrived, maybe long ago (a slow body, a quota
            # hold): a producer being purged writes nothing more, whatever it came through
            # (a token, or the KT/memcached write listeners, which hold none) — the purge
            # relies on it (`settled`). No await from here to the submit.
            if p.name in self._fenced or p.name not in self.acl.producers:
                raise AuthError(
                    f"producer {p.name!r} is being removed or was: its writes are refused",
                    producer=p.name,
                )

            def stored_answer(results: list[Result]) -> bytes:
                a = answer(results)
                return orjson.dumps({"status": a.status, "body": a.body, "fp": fp})

            fut = self.batcher.submit(
                ops,
                nbytes,
                p.name,
                idem_key=idem_key,
                answer=stored_answer if idem_key is not None else None,
                deletes=deletes,
            )
        except BaseException:
            self.storage.reserve(p.name, -growth)
            raise
        if growth:
            fut.add_done_callback(lambda _f: self.storage.reserve(p.name, -growth))
        pending = self._pending.setdefault(p.name, set())
        pending.add(fut)
        fut.add_done_callback(pending.discard)
        if is_async:
            fut.add_done_callback(_retrieve)
            if hold is not None:  # a retry before the commit replays this 202
                hold(fut)
            return Answer(202, {"status": "accepted", "ops": len(ops)}, headers)
        results = await fut
        metrics.WRITE_ACK.labels(p.name).observe(time.perf_counter() - t0)
        a = answer(results)
        if headers:
            a.headers.update(headers)
        return a

    @contextlib.contextmanager
    def fence(self, producer: str) -> Iterator[None]:
        """While held, every write of `producer` not yet submitted is refused (401) when it
        reaches its submit — one authenticated before (a slow body, a quota hold) too."""
        self._fenced.add(producer)
        try:
            yield
        finally:
            self._fenced.discard(producer)

    async def settled(self, producer: str) -> None:
        """Return once every write of `producer` submitted so far has committed or failed.
        Under `fence` no new one is submitted, so a purge that waits for this has every
        write of the producer behind it."""
        pending = self._pending.pop(producer, None)  # fenced: no new one joins it
        if pending:
            await asyncio.wait(list(pending))


def _retrieve(fut: asyncio.Future[Any]) -> None:
    """Done-callback of async writes: consume the outcome (errors are logged by the batcher)."""
    if not fut.cancelled():
        fut.exception()
