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

#: Read requests that ended in an error answer, by op and reason (`crc`, `protocol`, ...).
READ_ERRORS = Counter(
    "mercury_read_errors_total", "Read requests answered with an error", ["op", "reason"]
)

#: Connections open now on each TCP read listener (`kt`, `memcached`).
LISTENER_CONNECTIONS = Gauge(
    "mercury_listener_connections", "Connections open on a TCP read listener", ["listener"]
)
#: Connections refused at the cap and held, outside `mercury_listener_connections`, for
#: the first byte that chooses their busy reply (KT: binary or HTTP; at most 64, 1 s).
LISTENER_HELD_REFUSED = Gauge(
    "mercury_listener_held_refused_connections",
    "Connections refused at a TCP read listener's cap, held for their first byte",
    ["listener"],
)
#: Connections refused (over the cap), evicted or closed by a limit, by reason:
#: `max_connections` (at the cap, none idle), `evicted` (idle, closed at the cap for a
#: newcomer), `idle_timeout`, `header_timeout`, `body_timeout`, `write_timeout`.
LISTENER_REFUSED = Counter(
    "mercury_listener_refused_total",
    "Connections a TCP read listener refused or closed on a limit, by reason",
    ["listener", "reason"],
)

#: Reply bytes the connections of a TCP read listener hold for writing (not yet taken by
#: their clients), summed and the largest one's, sampled once a second. Each connection
#: stops producing replies above its transport's high-water mark (`reads.tcp`).
LISTENER_QUEUED = Gauge(
    "mercury_listener_write_queued_bytes",
    "Reply bytes a TCP read listener's connections hold for writing (sampled each second)",
    ["listener"],
)
LISTENER_QUEUED_MAX = Gauge(
    "mercury_listener_write_queued_max_bytes",
    "Reply bytes the fullest connection of a TCP read listener holds for writing",
    ["listener"],
)

#: Watch streams (`GET /v1/watch`) open now on this process.
WATCH_STREAMS = Gauge("mercury_watch_streams", "Watch streams open on this node")
#: Watch streams the node ended itself, by reason: `slow` (the watcher fell too far
#: behind), `stopping` (the server stops), `log` (the log could not be read).
WATCH_ENDED = Counter(
    "mercury_watch_ended_total", "Watch streams ended by the node, by reason", ["reason"]
)
