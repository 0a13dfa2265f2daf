"""Semi-synchronous acknowledgement: which seq N standbys have durably applied (pure).

Standbys report the last seq they applied (after their commit) on the replication link. A
batch ending at seq S may be acknowledged once `required` distinct standbys reported a seq
of at least S. Reports older than `fresh_s` do not count: a standby that went silent is not
in sync (standbys report at least every second while connected, even when idle).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SyncTracker:
    """Applied seqs reported by standbys (by standby id)."""

    required: int
    fresh_s: float
    _seen: dict[bytes, tuple[int, float]] = field(default_factory=dict)

    def applied(self, standby: bytes, seq: int, now: float) -> None:
        """`standby` reported at `now` that it durably applied up to `seq`."""
        # A standby that re-bootstrapped may report a lower seq: its latest word counts.
        self._seen[standby] = (seq, now)

    def synced_seq(self, now: float) -> int:
        """The highest seq at least `required` fresh standbys applied (a huge number when
        none is required, 0 when too few are fresh)."""
        if self.required <= 0:
            return 1 << 62
        seqs = sorted(
            (s for s, at in self._seen.values() if now - at <= self.fresh_s), reverse=True
        )
        return seqs[self.required - 1] if len(seqs) >= self.required else 0

    def in_sync(self, now: float) -> int:
        """How many standbys reported within `fresh_s`."""
        return sum(1 for _, at in self._seen.values() if now - at <= self.fresh_s)

    def forget_stale(self, now: float) -> None:
        """Drop standbys silent for ten freshness periods (bounded memory)."""
        for k in [k for k, (_, at) in self._seen.items() if now - at > 10 * self.fresh_s]:
            del self._seen[k]
