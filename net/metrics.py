"""Prometheus metrics of every listener's transport (process-wide, as Prometheus clients are)."""

import contextlib
import threading
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from net.budget import Reason
from net.tlsconf import TlsFiles

#: Read requests that ended in an error answer, by op and reason (`crc`, `protocol`, ...).
READ_ERRORS = Counter(
    "mercury_read_errors_total", "Read requests answered with an error", ["op", "reason"]
)

#: Times a connection's bulk work (a slice of a big request) waited for the store's
#: commits in flight to end before its next slice (`TcpService.yield_to`, the root).
LISTENER_COMMIT_WAITS = Counter(
    "mercury_listener_commit_waits",
    "Times bulk work on a TCP listener waited for a commit in flight before its next slice",
    ["listener"],
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

#: Every connection budget of the process (`net.budget`), by name: `http` (the HTTP
#: listener), `tls_handshakes`, `kt`, `memcached`, and any budget of streams (`watch`).
BUDGET_MEMBERS = Gauge(
    "mercury_budget_members", "Members a connection budget holds now", ["budget"]
)
BUDGET_CAP = Gauge("mercury_budget_cap", "Members a connection budget holds at most", ["budget"])
#: What each budget refused or closed, by `net.budget.Reason` value: refused, evicted,
#: share (evicted: its principal held more than its share), share_refused, slow_body,
#: body, head, idle, write, header_too_large, unsent_cap, buffer_cap.
BUDGET_CLOSED = Counter(
    "mercury_budget_closed_total",
    "Members a connection budget refused, evicted or closed on a bound, by reason",
    ["budget", "reason"],
)


def budget_hooks(
    name: str,
    cap: int,
    count: Callable[[Reason], None] | None = None,
    on_size: Callable[[int], None] | None = None,
) -> tuple[Callable[[Reason], None], Callable[[int], None]]:
    """The `count` and `on_size` of a `net.budget.Budget` named `name`: each feeds the
    budget metrics above, then the listener's own (`count`, `on_size`) if any."""
    BUDGET_CAP.labels(name).set(cap)
    members = BUDGET_MEMBERS.labels(name)

    def counted(reason: Reason) -> None:
        BUDGET_CLOSED.labels(name, reason.value).inc()
        if count is not None:
            count(reason)

    def sized(n: int) -> None:
        members.set(n)
        if on_size is not None:
            on_size(n)

    return counted, sized


class _CertExpiry(Collector):
    """`mercury_tls_cert_expiry_timestamp_seconds{cert}`: when this node's certificate
    (`node`) and its CA's (`ca`) stop being valid, read from the files at each scrape, so a
    certificate replaced on disk and reloaded (SIGHUP) shows its new date without a hook. A
    file that cannot be read or parsed is left out (its reload fails loudly anyway)."""

    def __init__(self) -> None:
        self.files: TlsFiles | None = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            files = self.files
        if files is None:
            return
        family = GaugeMetricFamily(
            "mercury_tls_cert_expiry_timestamp_seconds",
            "When this node's TLS certificate (cert=node) and its CA's (cert=ca) expire, "
            "seconds since the epoch",
            labels=["cert"],
        )
        for cert, path in (("node", files.cert), ("ca", files.ca)):
            with contextlib.suppress(OSError, ValueError):
                family.add_metric([cert], not_after(path))
        yield family


def not_after(path: str) -> float:
    """The end of validity of the first certificate in PEM file `path` (epoch seconds)."""
    from cryptography import x509

    with open(path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    return cert.not_valid_after_utc.timestamp()


CERT_EXPIRY = _CertExpiry()
REGISTRY.register(CERT_EXPIRY)


def watch_certs(files: TlsFiles) -> None:
    """Export the expiry of the certificates in `files` (this process's TLS files)."""
    with CERT_EXPIRY._lock:
        CERT_EXPIRY.files = files
