"""Prometheus metrics the store itself owns (process-wide, as Prometheus clients are)."""

from prometheus_client import Counter

CRC_FAILURES = Counter(
    "mercury_crc_failures_total", "Stored values or log records that failed their CRC on read"
)
