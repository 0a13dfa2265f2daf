"""Storage quota (``max_bytes_stored``): 507 before a write would store too much.

Counts what the store holds (its usage counters) plus the growth of each producer's
writes admitted but not yet committed, so a burst inside one batch window cannot
overshoot. Runs on the event loop; reads the store with point gets only.
"""

from __future__ import annotations

from acl.model import Producer
from core.errors import StorageQuotaError
from store.ops import SET, Op
from store.store import Store
from store.usage import Usage, stored_bytes


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

    def reserve(self, producer: str, growth: int) -> None:
        """Add (or, negative, release) growth admitted under a storage quota."""
        if growth:
            left = self._pending.get(producer, 0) + growth
            if left:
                self._pending[producer] = left
            else:
                self._pending.pop(producer, None)
