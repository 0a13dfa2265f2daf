"""Prometheus metrics of the read side (process-wide, as Prometheus clients are)."""

from prometheus_client import Counter, Gauge, Histogram

#: Server-side time of one read request, from parsed request to the answer handed to the
#: transport. `op` names the protocol and call (`http_get`, `kt_get_bulk`, `memcached_get`...).
READ_SECONDS = Histogram(
    "mercury_read_seconds",
    "Time to serve one read request, by protocol and operation",
    ["op"],
    buckets=(
        0.00002,
        0.00005,
        0.0001,
        0.0002,
        0.0005,
        0.001,
        0.002,
        0.005,
        0.01,
        0.05,
        0.25,
        1.0,
    ),
)

# Requests that ended in an error answer are counted by every listener, so the counter
# lives with the listeners' transport (`net/metrics.py`); re-exported here for the HTTP read API.
from net.metrics import READ_ERRORS as READ_ERRORS  # noqa: E402

#: Watch streams (`GET /v1/watch`) open now on this process.
WATCH_STREAMS = Gauge("mercury_watch_streams", "Watch streams open on this node")
#: Watch streams the node ended itself, by reason: `slow` (the watcher fell too far
#: behind), `stopping` (the server stops), `log` (the log could not be read).
WATCH_ENDED = Counter(
    "mercury_watch_ended_total", "Watch streams ended by the node, by reason", ["reason"]
)
#: Watch streams reading their history now (`from_seq` behind the node), a step at a time.
WATCH_CATCHUPS = Gauge("mercury_watch_catchup_streams", "Watch streams catching up now")
#: Decompressed log records the catching-up streams share (`reads.watch.RecordCache`).
WATCH_RECORD_BYTES = Gauge(
    "mercury_watch_record_cache_bytes", "Bytes of log records held for catching-up watch streams"
)
