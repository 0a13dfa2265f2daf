"""Write-side Prometheus metrics (docs/api.md). Metric objects are the only module globals
the style guide allows: Prometheus clients are process-wide by design."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

# Fine steps just above the default 500 ms window: the ack goal is window + 50 ms.
_LAT = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    0.51,
    0.52,
    0.53,
    0.54,
    0.55,
    0.56,
    0.575,
    0.6,
    0.75,
    1.0,
    2.5,
    5.0,
    10.0,
)


def _shared_gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
    """A gauge another component may also export from this process: reuse it if present."""
    existing = REGISTRY._names_to_collectors.get(name)
    if existing is not None:
        return existing
    return Gauge(name, doc, labels)


WRITE_OPS = Counter(
    "mercury_write_ops_total", "Write ops answered by the gateway", ("producer", "result")
)
BATCH_COMMIT = Histogram(
    "mercury_batch_commit_seconds", "Time to commit one batch (LMDB txn + fsync)", buckets=_LAT
)
BATCH_OPS = Histogram(
    "mercury_batch_ops",
    "Ops per committed batch",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000),
)
WRITE_ACK = Histogram(
    "mercury_write_ack_seconds",
    "From request received to durable acknowledgement (quota holds included)",
    ("producer",),
    buckets=_LAT,
)
BATCH_ACK_WAIT = Histogram(
    "mercury_batch_ack_wait_seconds",
    "From a batch's commit to its writers' answers, with an acknowledgement gate (HA: the "
    "standbys' confirmation); not observed without one",
    buckets=(
        *(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05),
        *(0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    ),
)
QUOTA_DELAY = Histogram(
    "mercury_quota_delay_seconds",
    "Time a request was held by its quota",
    ("producer",),
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
QUOTA_OPS = Counter(
    "mercury_quota_ops_total",
    "Ops over their producer's rate quota, by outcome: held (then admitted), refused "
    "(429), too_large (413: no wait admits them), shadow (counted, not enforced)",
    ("producer", "outcome"),
)
BATCH_OVERLOADED = Counter(
    "mercury_batch_overloaded_total",
    "Writes refused with 503 because the open batch and the queue of full ones were full",
)
LOG_LAST_SEQ = _shared_gauge("mercury_log_last_seq", "Seq of the last committed log entry")
BATCH_WAITING = Gauge(
    "mercury_batch_waiting_requests",
    "Write requests in the open batch or in full batches queued behind a commit (not yet "
    "being committed)",
)
USAGE_BYTES = Gauge("mercury_usage_bytes", "Bytes stored per producer", ("producer",))
USAGE_KEYS = Gauge("mercury_usage_keys", "Keys stored per producer", ("producer",))

EXPIRY_BACKLOG = Gauge(
    "mercury_expiry_backlog",
    "Keys whose deadline has passed and whose expiry is not logged yet (counted up to "
    "100,000; the root's expirer logs them in bounded batches)",
)
EXPIRED = Counter("mercury_expired_keys_total", "Keys the root's expirer logged as expired")
EXPIRY_LATENESS = Histogram(
    "mercury_expiry_lateness_seconds",
    "From a key's deadline to the commit of its logged expiry, on the root",
    buckets=(0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0, 10.0, 30.0, 60.0),
)
