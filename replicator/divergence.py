"""Does another node's hash head show that this replica holds another history? (pure)

Logs are shipped byte-identical, so one history has one set of record boundaries and one
hash head at each of them. A replica compares what it holds at a seq (`Point`) with:

- the root's hash head at the root's seq, carried by head-aware heartbeats
  (`frames.OPT_HEADS`) — this catches a root restored from an older copy that took other
  writes up to exactly the replica's seq (no new record ever arrives to fail the chain
  check), or stays below it with other writes;
- the evidence of a source that stopped as diverged (`frames.REFUSE_DIVERGED`): a point of
  the history its own source abandoned; holding the same point means holding that history.
"""

from __future__ import annotations

from typing import NamedTuple


class Point(NamedTuple):
    """Where one record of this node's log ends, its hash head there, and the root's commit
    time of that record (µs; 0 when not known, e.g. a bootstrapped snapshot's head)."""

    last_seq: int
    head: bytes
    time_us: int


def heartbeat_shows_divergence(hb_seq: int, hb_head: bytes, hb_time_us: int, own: Point) -> bool:
    """True when the root's head `hb_head` at `hb_seq` (reported at root time `hb_time_us`)
    is not this node's `own` record holding `hb_seq`: another hash head, or another record
    boundary (the root's seq always ends one of its records).

    A heartbeat made before this node's record was committed tells nothing about it: a
    relayed heartbeat can be older than the records streamed after it (after an HA
    failover, the last heartbeat of the deposed leader, whose unconfirmed tail the new
    leader never had). Both times are the root's clock.
    """
    if own.time_us and own.time_us > hb_time_us:
        return False
    return own.last_seq != hb_seq or own.head != hb_head


def holds(own: Point | None, seq: int, head: bytes) -> bool:
    """True when this node's record ending at `seq` has hash head `head`."""
    return own is not None and own.last_seq == seq and own.head == head


class RecentPoints:
    """The points of the records applied lately (at most `size`), by last seq: a heartbeat
    usually names a seq applied moments ago, and looking it up here costs no log read (a
    log read copies the record's payload, up to 256 MiB)."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._points: dict[int, Point] = {}

    def add(self, point: Point) -> None:
        """Remember `point` (forgetting the oldest past `size`)."""
        self._points[point.last_seq] = point
        if len(self._points) > self._size:
            del self._points[next(iter(self._points))]

    def get(self, seq: int) -> Point | None:
        """The point of the record ending at `seq`, when remembered."""
        return self._points.get(seq)
