"""The simulator's invariants (pure): each takes what a run observed and returns what is
wrong, or None. `sim/run.py` calls them during and after every run.

- `applied`: every commit of a replica moves its seq forward (no replay) to a point of the
  root's history — the same hash head the root had at that seq. The hash chain covers
  every earlier record, so this also shows that no record was skipped (a gap) or applied
  with other bytes (corrupt).
- `source_cycle`: the sources replicas stream from never form a cycle.
- `lag`: the lag a node reports (`replicator.lag.lag_seconds`, what its
  `mercury_replication_lag_seconds` shows) is the real lag — the age of the oldest root
  commit it does not hold — give or take what the definition allows: a heartbeat
  interval and its grace (a fresh heartbeat says "caught up" until the next is due), plus
  the gap between two root commits (lag is known per record) and the path's delay.
- `converged`: after the faults, every node holds the root's seq and hash head (and so
  every acknowledged write: the root acknowledges only what it committed).
"""

from __future__ import annotations

from collections.abc import Mapping


def applied(
    node: str, prev_seq: int, seq: int, head: bytes, root_heads: Mapping[int, bytes]
) -> str | None:
    """What is wrong with `node` committing up to `seq` with hash head `head` after
    `prev_seq` (None: nothing)."""
    if seq <= prev_seq:
        return f"{node} replayed: committed seq {seq} after seq {prev_seq}"
    want = root_heads.get(seq)
    if want is None:
        return f"{node} committed seq {seq}, which the root never committed"
    if want != head:
        return (
            f"{node} holds hash head {head.hex()[:16]} at seq {seq}, the root "
            f"{want.hex()[:16]}: a gap or a corrupt record was applied"
        )
    return None


def source_cycle(streaming_from: Mapping[str, str]) -> list[str] | None:
    """A cycle among the sources in use (node -> the node it streams from), or None."""
    done: set[str] = set()
    for start in sorted(streaming_from):
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node not in done:
            if node in on_path:
                return [*path[path.index(node) :], node]
            on_path.add(node)
            path.append(node)
            node = streaming_from.get(node)
        done.update(path)
    return None


def lag(node: str, reported: float | None, real: float, tolerance: float) -> str | None:
    """What is wrong with `node` reporting lag `reported` when it is `real` behind."""
    if reported is None:
        return None  # never heard from the root: it reports none, which is no lie
    if abs(reported - real) > tolerance:
        return (
            f"{node} reports lag {reported:.3f}s, its real lag is {real:.3f}s "
            f"(allowed difference {tolerance:.3f}s)"
        )
    return None


def converged(heads: Mapping[str, tuple[int, bytes]], root: tuple[int, bytes]) -> list[str]:
    """The nodes whose (seq, hash head) is not the root's."""
    return sorted(n for n, h in heads.items() if h != root)
