"""Replication metrics. Values are computed at scrape time (`set_function`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REPLICATION_LAG = Gauge(
    "mercury_replication_lag_seconds",
    "Seconds this node is behind the root (from the root's heartbeats; 0 on the root)",
)
APPLIED_SEQ = Gauge(
    "mercury_replication_applied_seq", "Last seq applied (committed on the root) on this node"
)
WORKER_RESTARTS = Counter(
    "mercury_replication_worker_restarts_total", "Replication worker processes restarted"
)
DIVERGED = Gauge(
    "mercury_replication_diverged",
    "1 when this replica's history differs from its source's (replication stopped; "
    "re-bootstrap: see docs/operations.md), else 0",
)
