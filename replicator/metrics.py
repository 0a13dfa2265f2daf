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
REFUSED = Counter(
    "mercury_repl_refused",
    "Connections a replication source closed without serving them, by reason (plaintext, "
    "no_certificate, untrusted_certificate, tls_failed, tls_timeout, too_many, or the "
    "handshake refusal: db_id, self, bootstrap, protocol, not_ready)",
    ["reason"],
)
