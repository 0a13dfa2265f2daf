"""How long one slice of bulk work may hold an event loop (`SliceClock`).

A big request on a listener (a million-key KT `get_bulk`: decoding its body, reading its
keys, encoding its reply) is a generator that yields between slices, and the connection
lets every other callback of the loop run before the next slice (`net/tcp.py`). A slice
bounded by a count of items is as long as the items are slow on that machine; one bounded
by time is not: each loop turn gives bulk work at most `SLICE_S` (plus one small chunk),
so a write's request, its batch timer and its answer, which need a few turns each, wait
milliseconds, not the hundreds a count-bounded slice of pure-Python work can take.
"""

from __future__ import annotations

import time

#: Wall time a slice of bulk work runs before yielding to the loop.
SLICE_S = 0.002
#: Items a caller handles between two looks at the clock (a look costs ~50 ns; an item
#: several µs).
CHUNK = 64


class SliceClock:
    """`due()`: this slice has run `budget` seconds; yield, then `start()` the next."""

    __slots__ = ("budget", "t0")

    def __init__(self, budget: float = SLICE_S) -> None:
        self.budget = budget
        self.t0 = time.perf_counter()

    def start(self) -> None:
        """A new slice begins (call after resuming from the yield)."""
        self.t0 = time.perf_counter()

    def due(self) -> bool:
        """True once the current slice has run its budget."""
        return time.perf_counter() - self.t0 >= self.budget
