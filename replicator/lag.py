"""Replication lag in seconds, from the root's heartbeats (pure).

Definition (documented in docs/replication.md): a node knows it holds everything the root
had committed up to root time `known_us` — the newest heartbeat whose seq it had applied
when the heartbeat arrived, or the commit time of the newest log record it applied (log
records carry the root's commit time, byte-identical down the tree). When the node has
applied the newest heartbeat's seq and that heartbeat is fresh (no older than its interval
plus a grace), it is caught up: lag 0. Otherwise lag = now − known. Clocks of the root and
the node are assumed NTP-synchronised; skew adds to the figure.
"""

from __future__ import annotations

#: Delivery slack added to the heartbeat interval before a silent source counts as lag.
GRACE_US = 250_000


def lag_seconds(
    now_us: int,
    applied_seq: int,
    known_us: int,
    hb_time_us: int,
    hb_seq: int,
    hb_interval_ms: int,
) -> float | None:
    """Lag of a node in seconds, or None when it has never heard from the root."""
    if hb_time_us == 0 and known_us == 0:
        return None
    fresh = now_us - hb_time_us <= hb_interval_ms * 1000 + GRACE_US
    if hb_time_us and applied_seq >= hb_seq and fresh:
        return 0.0
    return max(0.0, (now_us - known_us) / 1e6)
