"""Replication metrics. Values are computed at scrape time (`set_function`)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from replicator.status import ReplicaStatus

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


STREAMING = Gauge(
    "mercury_replication_streaming",
    "1 while this replica streams from a source, else 0 (connecting, reconnecting, "
    "bootstrapping, diverged, failed)",
)
#: NaN until a replica or standby wires it: the root imports this module too, and a 0 there
#: would read as a replica that stopped streaming.
STREAMING.set(math.nan)


class _Refused(Collector):
    """`mercury_repl_refused_total{reason}`: connections a replication source closed
    without serving them. Counted in the process that runs the source; a replica's parent
    adds its worker's counts (published in its status document) through `external`."""

    def __init__(self) -> None:
        self._local: dict[str, int] = {}
        self._lock = threading.Lock()
        self.external: Callable[[], dict[str, int]] = dict

    def inc(self, reason: str) -> None:
        """Count one refusal."""
        with self._lock:
            self._local[reason] = self._local.get(reason, 0) + 1

    def counts(self) -> dict[str, int]:
        """This process's counts by reason."""
        with self._lock:
            return dict(self._local)

    def collect(self) -> Iterator[CounterMetricFamily]:
        """The counts of this process plus the external ones, by reason."""
        total = self.counts()
        for reason, n in self.external().items():
            total[reason] = total.get(reason, 0) + n
        family = CounterMetricFamily(
            "mercury_repl_refused",
            "Connections a replication source closed without serving them, by reason "
            "(plaintext, no_certificate, untrusted_certificate, tls_failed, tls_timeout, "
            "too_many (at the cap, every slot a stream or transfer), share_refused, evicted and "
            "share_evicted (a connection still without a HELLO closed at the cap for a newcomer), "
            "or the handshake refusal: db_id, self, bootstrap, protocol, not_ready, "
            "diverged)",
            labels=["reason"],
        )
        for reason, n in sorted(total.items()):
            family.add_metric([reason], n)
        yield family


REFUSED = _Refused()
REGISTRY.register(REFUSED)


class _Applier(Collector):
    """What a replica's applier did and what it cost, from the worker's published status
    (`replicator/status.py`): counters since the worker started (a restarted worker starts
    them again, which Prometheus reads as a counter reset). CPU per MB applied is
    ``rate(..._cpu_seconds_total) / rate(..._applied_bytes_total) * 1e6``; records per
    transaction ``rate(..._applied_records_total) / rate(..._apply_commits_total)``."""

    FAMILIES = (
        ("applied_records", "mercury_replication_applied_records", "Log records applied"),
        (
            "applied_bytes",
            "mercury_replication_applied_bytes",
            "Bytes of log records applied, as replicated (header and compressed payload)",
        ),
        (
            "apply_commits",
            "mercury_replication_apply_commits",
            "Write transactions (one commit each, with its fsync unless --no-sync) that "
            "applied records",
        ),
        (
            "apply_seconds",
            "mercury_replication_apply_seconds",
            "Seconds the applier spent inside those transactions",
        ),
        (
            "cpu_seconds",
            "mercury_replication_worker_cpu_seconds",
            "CPU seconds (user + system) the replication worker process has used",
        ),
    )

    def __init__(self) -> None:
        #: The worker's published status, or None before it published one (set by the
        #: process wiring; nothing is exported until then).
        self.source: Callable[[], ReplicaStatus | None] = lambda: None

    def collect(self) -> Iterator[CounterMetricFamily]:
        """One counter per fact, when the worker has published."""
        st = self.source()
        if st is None:
            return
        for field, name, doc in self.FAMILIES:
            yield CounterMetricFamily(name, doc, value=float(getattr(st, field)))


APPLIER = _Applier()
REGISTRY.register(APPLIER)
