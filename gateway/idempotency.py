"""Idempotency-Key: a retry gets the first answer, never a second write.

The first answer is stored by the batcher in the batch's own transaction; a retry of a
committed request reads it from the store, a retry of one still in flight waits for it.
Stored answers older than the TTL are collected by `gc_loop`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor

import orjson

from core.errors import BadRequestError, MercuryError
from gateway.answers import Answer
from store.store import Store

log = logging.getLogger("mercury.gateway")
#: Longest Idempotency-Key: with the producer name (≤ 255 bytes) it must fit an LMDB key.
MAX_IDEMPOTENCY_KEY = 200
REPLAYED = {"Idempotent-Replayed": "true"}


def store_key(producer: str, idem: str) -> bytes:
    """The store key of `producer`'s Idempotency-Key `idem` (400 when out of bounds)."""
    if not idem or len(idem.encode("utf-8", "surrogatepass")) > MAX_IDEMPOTENCY_KEY:
        raise BadRequestError(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} bytes, got {len(idem)}"
        )
    return b"i" + producer.encode() + b"\x00" + idem.encode("utf-8", "surrogatepass")


class Idempotency:
    """Answers of requests in flight, by store key, for concurrent retries."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._inflight: dict[bytes, asyncio.Future[Answer]] = {}

    async def once(self, key: bytes, write: Callable[[], Awaitable[Answer]]) -> Answer:
        """`write()`'s answer, or the first answer of the request with this `key`."""
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
            ans = await write()
        except BaseException as err:
            fut.set_exception(err)
            fut.exception()  # marks it retrieved; waiters re-raise it themselves
            raise
        else:
            fut.set_result(ans)
            return ans
        finally:
            del self._inflight[key]


async def gc_loop(store: Store, executor: Executor, ttl_s: float, every_s: float) -> None:
    """Drop stored answers older than `ttl_s`, every `every_s` (in the commit thread)."""
    loop = asyncio.get_running_loop()
    while True:
        cutoff = int((time.time() - ttl_s) * 1e6)
        try:
            await loop.run_in_executor(executor, store.gc_idempotency, cutoff)
        except MercuryError as err:  # the next round retries
            log.warning("idempotency GC failed: %s", err)
        await asyncio.sleep(every_s)
