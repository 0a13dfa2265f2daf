"""The cache node's Prometheus metrics (`GET /metrics` of `mercury cache`).

Counters are the state machine's own (`cache.state.Counters`), read at each scrape by a
collector rather than incremented twice; gauges and the miss latency are set as they
change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from cache.state import Counters

BYTES = Gauge("mercury_cache_bytes", "Bytes held by the cache's entries (what --max-bytes bounds)")
ENTRIES = Gauge("mercury_cache_entries", "Entries held (negative ones included)")
APPLIED = Gauge("mercury_cache_applied_seq", "Last seq whose invalidations the cache applied")
MISS_SECONDS = Histogram(
    "mercury_cache_miss_seconds",
    "Time to answer a read that missed: the fetch from the source and its install",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)

_COUNTERS = (
    ("hits", "Reads answered from a cached value"),
    ("negative_hits", "Reads answered from a cached absence (404 without asking the source)"),
    ("misses", "Keys read that the cache did not hold (fetched from the source)"),
    ("evictions", "Entries evicted to stay within --max-bytes"),
    ("invalidations", "Entries dropped because a change to their key was applied"),
    ("stale_answers", "Answers of the source older than what the cache applied (fetched again)"),
)


class _Collector(Collector):
    def __init__(self, counters: Callable[[], Counters], lag: Callable[[], float | None]):
        self._counters = counters
        self._lag = lag

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        c = self._counters()
        for name, doc in _COUNTERS:
            yield CounterMetricFamily(f"mercury_cache_{name}", doc, value=getattr(c, name))
        lag = self._lag()
        yield GaugeMetricFamily(
            "mercury_cache_lag_seconds",
            "Seconds behind the root (NaN: never heard from it); see /v1/status lagging",
            value=float("nan") if lag is None else lag,
        )


_registered: list[_Collector] = []


def register(counters: Callable[[], Counters], lag: Callable[[], float | None]) -> None:
    """Export the node's counters and lag: the node made last in this process (one per
    process in `mercury cache`; tests make several)."""
    for old in _registered:
        REGISTRY.unregister(old)
    _registered[:] = [_Collector(counters, lag)]
    REGISTRY.register(_registered[0])
