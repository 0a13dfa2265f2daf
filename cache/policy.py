"""The cache node's eviction policy: a segmented LRU bounded in bytes (pure, no I/O).

Why segmented: a plain LRU admits every miss at the head, so one pass over many keys read
once (a scan, a batch job, a crawler) pushes the whole hot set out. Here a key enters the
*probation* segment and moves to the *protected* one only when it is read again while
held; protected holds at most `protected_share` of the budget and overflows back into
probation's head, and eviction takes probation's tail first. A scan then churns probation
only: the keys read twice — the hot set — stay protected (`tests/cache/test_policy.py`
measures it; `bench/cache_node.py` reports the hot set's hit ratio after a full scan).

Sizes are what the cache's own store holds for an entry (key + value + a fixed overhead,
`entry_size`), so the bound is on bytes held, not on entries.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

#: Bytes counted per entry beyond its key and value: the LMDB node header and the entry's
#: own header (`cache.store`), so many tiny values cannot exceed the budget unseen.
ENTRY_OVERHEAD = 48


def entry_size(key: bytes, value: bytes | None) -> int:
    """Bytes an entry is charged (a negative entry costs its key and the overhead)."""
    return len(key) + (len(value) if value is not None else 0) + ENTRY_OVERHEAD


class Slru:
    """Segmented LRU over keys with byte sizes; `admit` returns the keys it evicted."""

    def __init__(self, max_bytes: int, protected_share: float = 0.8) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        if not 0.0 < protected_share < 1.0:
            raise ValueError("protected_share must be in (0, 1)")
        self.max_bytes = max_bytes
        self.protected_max = int(max_bytes * protected_share)
        # Least recently used first (OrderedDict: move_to_end is O(1)).
        self._probation: OrderedDict[bytes, int] = OrderedDict()
        self._protected: OrderedDict[bytes, int] = OrderedDict()
        self._probation_bytes = 0
        self._protected_bytes = 0

    @property
    def held_bytes(self) -> int:
        """Bytes held by every entry."""
        return self._probation_bytes + self._protected_bytes

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def __contains__(self, key: bytes) -> bool:
        return key in self._probation or key in self._protected

    def protected(self, key: bytes) -> bool:
        """True when `key` is in the protected segment (it was read again while held)."""
        return key in self._protected

    def touch(self, key: bytes) -> None:
        """`key` was read (a hit): probation -> protected, protected -> its head."""
        if key in self._protected:
            self._protected.move_to_end(key)
            return
        size = self._probation.pop(key, None)
        if size is None:
            return
        self._probation_bytes -= size
        self._protected[key] = size
        self._protected_bytes += size
        # Protected over its share: its least recent keys go back to probation's head
        # (recently used, not yet evictable before the scan's one-time keys).
        while self._protected_bytes > self.protected_max and len(self._protected) > 1:
            k, s = self._protected.popitem(last=False)
            self._protected_bytes -= s
            self._probation[k] = s
            self._probation_bytes += s

    def admit(self, key: bytes, size: int, *, protected: bool = False) -> list[bytes]:
        """Hold `key` (`size` bytes; replacing its old size, keeping its segment) and return
        the keys evicted to stay within `max_bytes` — `key` itself when it alone is larger
        than the budget. `protected`: restore it into the protected segment (a restart
        reloading what it held)."""
        if size > self.max_bytes:
            self.remove(key)
            return [key]
        if key in self._protected:
            self._protected_bytes += size - self._protected[key]
            self._protected[key] = size
            self._protected.move_to_end(key)
        elif key in self._probation:
            self._probation_bytes += size - self._probation[key]
            self._probation[key] = size
            self._probation.move_to_end(key)
        elif protected and self._protected_bytes + size <= self.protected_max:
            self._protected[key] = size
            self._protected_bytes += size
        else:
            self._probation[key] = size
            self._probation_bytes += size
        return self._evict(keep=key)

    def remove(self, key: bytes) -> bool:
        """Forget `key` (an invalidation); True when it was held."""
        size = self._probation.pop(key, None)
        if size is not None:
            self._probation_bytes -= size
            return True
        size = self._protected.pop(key, None)
        if size is not None:
            self._protected_bytes -= size
            return True
        return False

    def protected_keys(self) -> list[bytes]:
        """The keys of the protected segment, least recent first."""
        return list(self._protected)

    def keys(self) -> Iterable[bytes]:
        """Every key held (probation then protected, least recent first)."""
        yield from self._probation
        yield from self._protected

    def _evict(self, keep: bytes) -> list[bytes]:
        # `keep` (just admitted or updated) is at its segment's most recent end: it is
        # the least recent one only when it is alone there, and is never evicted for itself.
        out: list[bytes] = []
        while self.held_bytes > self.max_bytes:
            if self._probation and next(iter(self._probation)) != keep:
                k, s = self._probation.popitem(last=False)
                self._probation_bytes -= s
            elif self._protected and next(iter(self._protected)) != keep:
                k, s = self._protected.popitem(last=False)
                self._protected_bytes -= s
            else:
                break
            out.append(k)
        return out
