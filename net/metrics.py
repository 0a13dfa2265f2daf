"""Prometheus metrics of every listener's transport (process-wide, as Prometheus clients are)."""

from prometheus_client import Counter, Gauge

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
#: stops producing replies above its transport's high-water mark (`net.tcp`).
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
