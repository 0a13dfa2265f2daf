"""The cache node's consistency rules: when an answer may be installed, what an
invalidation drops (pure, no I/O; `tests/property/test_cache_rules.py` drives them).

Vocabulary. The cache follows its source's *invalidation stream*: for every log record,
its last seq and each key it changed with the seq of that change (no values). `applied`
(A) is the last seq whose invalidations the cache has applied. A miss is fetched from the
source, which reads the key in one read transaction and answers with the seq that
transaction saw (S, the answer's *read seq*) — the value is the key's value as of S. An
entry remembers the read seq it was installed with.

Two watermarks:

- `horizon` (M): the highest seq this node has installed or applied, max(A, every S
  installed). A miss is asked at a seq of at least M; an answer read at S >= M is always
  installed.
- `floor` (F) and `recent`: the latest invalidated seq of each key invalidated in
  (F, A], bounded by count (the oldest are forgotten and F rises). They let an answer
  read at S < M still be installed when no answer ran ahead of the stream (M == A) and
  the key did not change in (S, A] — reordered answers and a source a little behind the
  stream cost no refetch. Otherwise the answer is *stale*: the node asks again at M.

The guarantees these rules give (docs/replication.md, "Cache nodes"):

1. No value is served after the cache applied the seq that replaced or deleted it: an
   invalidation of key k at seq q drops k's entry when the entry was read before q
   (`invalidate`), and no answer read before q is installed once q is applied (S >= M >= A,
   or recent[k] <= S with S >= F).
2. Monotonic reads, per node and per key: every value of k served before was read at a
   seq <= M, and an answer is installed only at S >= M or, when M == A, if k did not change
   in (S, A] — so k's version never goes back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from enum import Enum

#: Keys whose latest invalidation is remembered (`recent`); older ones raise the floor.
RECENT_KEYS = 65536


class Install(Enum):
    """What to do with an answer (`Coherence.decide`)."""

    #: Install it and serve it.
    INSTALL = "install"
    #: The entry held was read at the same seq or later: keep it and serve it.
    KEEP = "keep"
    #: It may be older than what was applied or served: ask again at `horizon`.
    STALE = "stale"


class Coherence:
    """The watermarks and the recent invalidations (see the module docstring)."""

    def __init__(self, applied: int, horizon: int | None = None, recent_keys: int = RECENT_KEYS):
        self.applied = applied
        self.horizon = max(applied, horizon or 0)
        #: Invalidations at or below it are not remembered (a restart starts it at A).
        self.floor = applied
        self.recent: OrderedDict[bytes, int] = OrderedDict()
        self.recent_keys = recent_keys

    def decide(self, held: int | None, read_seq: int, key: bytes) -> Install:
        """The fate of an answer for `key` read at `read_seq`; `held`: the read seq of the
        entry held for `key` now (None: none)."""
        if held is not None and held >= read_seq:
            return Install.KEEP
        if read_seq >= self.horizon:
            return Install.INSTALL
        if (
            self.horizon == self.applied
            and read_seq >= self.floor
            and self.recent.get(key, 0) <= read_seq
        ):
            return Install.INSTALL
        return Install.STALE

    def installed(self, read_seq: int) -> None:
        """An answer read at `read_seq` was installed (or served)."""
        if read_seq > self.horizon:
            self.horizon = read_seq

    def invalidate(
        self,
        last_seq: int,
        changes: Iterable[tuple[int, bytes]],
        held: Callable[[bytes], int | None],
    ) -> list[bytes]:
        """Apply the invalidations of one record ending at `last_seq`: `changes` are (seq,
        key) in seq order; `held(key)` is the read seq of the entry held for it (None: not
        held). Returns the keys to drop. Raises ValueError for a record at or below
        `applied` (the stream goes forward only)."""
        if last_seq <= self.applied:
            raise ValueError(f"invalidation at seq {last_seq} is not after {self.applied}")
        drop: list[bytes] = []
        recent = self.recent
        for seq, key in changes:
            if seq <= self.applied or seq > last_seq:
                raise ValueError(f"change at seq {seq} outside ({self.applied}, {last_seq}]")
            recent[key] = seq
            recent.move_to_end(key)
            read_seq = held(key)
            if read_seq is not None and read_seq < seq and key not in drop:
                drop.append(key)
        while len(recent) > self.recent_keys:
            _k, q = recent.popitem(last=False)
            self.floor = max(self.floor, q)
        self.applied = last_seq
        if last_seq > self.horizon:
            self.horizon = last_seq
        return drop

    def restart_at(self, applied: int) -> None:
        """The stream restarts at `applied` without the history in between (the source no
        longer holds it): everything held must be dropped by the caller; the horizon stays
        (what was served is not unserved)."""
        self.applied = applied
        self.floor = applied
        self.recent.clear()
        self.horizon = max(self.horizon, applied)
