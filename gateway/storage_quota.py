"""Storage quota (``max_bytes_stored``): 507 before a write would store too much.

Counts what the store holds (its usage counters) plus the growth of each producer's
writes admitted but not yet committed, so a burst inside one batch window cannot
overshoot. Runs on the event loop; reads the store with point gets only.
"""

from __future__ import annotations

from collections.abc import Callable

from acl.model import Producer
from core.errors import StorageQuotaError
from store.ops import SET, Op
from store.store import Store
from store.usage import Usage, stored_bytes

#: (owner, stored bytes) of a key in the store, or None when it is absent.
StoredFn = Callable[[bytes], tuple[str, int] | None]


def request_growth(producer: str, ops: list[Op], stored: StoredFn) -> int:
    """Bytes `producer` may come to store more by applying `ops`: never negative, and never
    less than what the ops can really add.

    Per key, the request's own final value counts once (a key set a thousand times to ""
    is one key, not a thousand credits), against what the key costs `producer` now: its
    stored size when `producer` owns it, nothing when another producer does (the usage
    counters move the key to its new owner, so the writer pays for all of it). A key whose
    ops carry a condition may keep any of its set values (a failed condition skips a later
    set), so the largest counts. Shrinking or deleting earns no credit here: the usage
    counters give it back once committed, so no refusal rests on a credit that may not
    happen.
    """
    owner_len = len(producer.encode())
    final: dict[bytes, int] = {}
    largest: dict[bytes, int] = {}
    conditional: set[bytes] = set()
    for op in ops:
        new = stored_bytes(len(op.key), len(op.value), owner_len) if op.op == SET else 0
        final[op.key] = new
        if new > largest.get(op.key, 0):
            largest[op.key] = new
        if op.expect_seq is not None:
            conditional.add(op.key)
    growth = 0
    for key, new in final.items():
        if key in conditional:
            new = largest.get(key, 0)
        if new == 0:
            continue
        old = stored(key)
        base = old[1] if old is not None and old[0] == producer else 0
        if new > base:
            growth += new - base
    return growth


class StorageQuota:
    """Pending (admitted, uncommitted) growth per producer with a storage quota."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._pending: dict[str, int] = {}

    def check(self, p: Producer, ops: list[Op], usage: dict[str, Usage]) -> int:
        """Raise StorageQuotaError when the sets would grow `p`'s stored bytes beyond its
        quota; return this request's growth, which the caller `reserve`s until its batch
        is committed (the usage counters then hold it) or the request is refused."""
        limit = p.quota.max_bytes_stored
        if limit is None:
            return 0
        used = usage.get(p.name, Usage()).bytes + self._pending.get(p.name, 0)
        growth = request_growth(p.name, ops, self._stored)
        if growth > 0 and used + growth > limit:
            raise StorageQuotaError(
                f"producer {p.name!r} stores {used} bytes (writes not yet committed "
                f"included); this write adds {growth} and its storage quota is {limit}",
                producer=p.name,
                hint="delete keys or raise max_bytes_stored",
            )
        return growth

    def _stored(self, key: bytes) -> tuple[str, int] | None:
        old = self.store.get(key)
        if old is None:
            return None
        return old.owner, stored_bytes(len(key), len(old.value), len(old.owner.encode()))

    def reserve(self, producer: str, growth: int) -> None:
        """Add (or, negative, release) growth admitted under a storage quota."""
        if growth:
            left = self._pending.get(producer, 0) + growth
            if left:
                self._pending[producer] = left
            else:
                self._pending.pop(producer, None)
