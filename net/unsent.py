"""Which connections to drop when the answer bytes clients have not taken pass a cap: one
rule for the HTTP listeners (`net/http_bounds.py`) and the KT and memcached listeners
(`net/tcp.py`).

Only connections past their transport's high-water mark count (below it a connection holds
at most the mark). Dropped first: those whose clients took nothing since they passed the
mark (a client that never reads), then the others; within each, the one past the mark
longest (a new answer's client has had the least time to take it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class Held(Generic[C]):
    """A connection past its high-water mark: its unsent bytes now, and when it passed the
    mark with how many."""

    conn: C
    unsent: int
    paused_at: float
    paused_unsent: int


def to_drop(held: Iterable[Held[C]], cap: int) -> list[Held[C]]:
    """The connections to drop, in order, so that the others hold at most `cap` bytes."""
    items = list(held)
    total = sum(h.unsent for h in items)
    out: list[Held[C]] = []
    for h in sorted(items, key=lambda h: (h.unsent < h.paused_unsent, h.paused_at)):
        if total <= cap:
            break
        total -= h.unsent
        out.append(h)
    return out
