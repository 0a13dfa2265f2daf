"""The cache node's state machine: what it holds, its eviction policy and its consistency
rules together (pure, no I/O).

`CacheState` holds each entry's metadata (never the values: those live in the node's LMDB
cache, `cache.store`); every method returns what the node must change in its store — keys
to delete, the entry to put — so the store and this state cannot disagree on a rule. The
hypothesis stateful test (`tests/property/test_cache_rules.py`) drives this class against a
model of a root and its source.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from cache.policy import Slru, entry_size
from cache.rules import Coherence, Install


class Held(NamedTuple):
    """What the state knows of an entry held: its read seq, the key's version (0: a
    negative entry) and whether it is negative."""

    read_seq: int
    version: int
    negative: bool


@dataclass
class Counters:
    """Monotonic counters the node exports as metrics."""

    hits: int = 0
    negative_hits: int = 0
    misses: int = 0
    evictions: int = 0
    invalidations: int = 0
    stale_answers: int = 0


class Outcome(NamedTuple):
    """The fate of a miss's answer: the decision, whether to put the answer in the store
    (INSTALL), and the keys to delete from it (evicted to make room)."""

    decision: Install
    put: bool
    delete: list[bytes]


class CacheState:
    """Entries' metadata + eviction policy + consistency rules (see module docstring)."""

    def __init__(
        self,
        max_bytes: int,
        applied: int = 0,
        horizon: int | None = None,
        counters: Counters | None = None,
        **rules: int,
    ) -> None:
        self.policy = Slru(max_bytes)
        self.rules = Coherence(applied, horizon, **rules)
        self.held: dict[bytes, Held] = {}
        #: Passed on to a new state (the node's counters outlive a restart of its stream).
        self.counters = counters or Counters()

    @property
    def applied(self) -> int:
        return self.rules.applied

    @property
    def held_bytes(self) -> int:
        return self.policy.held_bytes

    def load(self, key: bytes, held: Held, size: int, protected: bool) -> list[bytes]:
        """An entry found in the store at start (warm restart); returns keys to delete
        (a smaller budget than the store was filled with evicts)."""
        self.held[key] = held
        self.rules.installed(held.read_seq)
        out = self.policy.admit(key, size, protected=protected)
        for k in out:
            self.held.pop(k, None)
        return out

    def lookup(self, key: bytes) -> Held | None:
        """A read of `key`: its entry (a hit, counted; the policy is told) or None (a miss)."""
        h = self.held.get(key)
        if h is None:
            self.counters.misses += 1
            return None
        if h.negative:
            self.counters.negative_hits += 1
        else:
            self.counters.hits += 1
        self.policy.touch(key)
        return h

    def answer(self, key: bytes, read_seq: int, value: bytes | None, version: int) -> Outcome:
        """An answer of the source to a miss of `key`, read at `read_seq` (`value` None:
        the key is absent there)."""
        decision = self.rules.decide(self._read_seq(key), read_seq, key)
        if decision is Install.STALE:
            self.counters.stale_answers += 1
            return Outcome(decision, False, [])
        if decision is Install.KEEP:
            return Outcome(decision, False, [])
        self.rules.installed(read_seq)
        self.held[key] = Held(read_seq, version if value is not None else 0, value is None)
        evicted = self.policy.admit(key, entry_size(key, value))
        for k in evicted:
            self.held.pop(k, None)
        self.counters.evictions += len(evicted)
        if key in evicted:  # larger than the whole budget: served, never held
            return Outcome(decision, False, [k for k in evicted if k != key])
        return Outcome(decision, True, evicted)

    def invalidate(self, last_seq: int, changes: Iterable[tuple[int, bytes]]) -> list[bytes]:
        """Invalidations of one record ending at `last_seq`; returns the keys to delete."""
        drop = self.rules.invalidate(last_seq, changes, self._read_seq)
        for k in drop:
            del self.held[k]
            self.policy.remove(k)
        self.counters.invalidations += len(drop)
        return drop

    def restart_at(self, applied: int) -> list[bytes]:
        """The stream restarts at `applied` without the history in between: every entry
        goes (returned: the keys to delete)."""
        self.rules.restart_at(applied)
        keys = list(self.held)
        self.held.clear()
        for k in keys:
            self.policy.remove(k)
        return keys

    def _read_seq(self, key: bytes) -> int | None:
        h = self.held.get(key)
        return None if h is None else h.read_seq
