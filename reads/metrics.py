"""Prometheus metrics of the read side (process-wide, as Prometheus clients are)."""

from prometheus_client import Counter, Histogram

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

#: Read requests that ended in an error answer, by op and reason (`crc`, `protocol`, ...).
READ_ERRORS = Counter(
    "mercury_read_errors_total", "Read requests answered with an error", ["op", "reason"]
)
