"""Durable usage counters as Prometheus counters that never reset on a restart.

`mercury_usage_{writes,deletes,duplicates,throttled}_total{producer}` are read at each
scrape from the store's usage counters (kept in the batch transactions, so they start
where the last process left them, and a promoted root's start where the old root's
ended). A process-local `Counter` would restart from zero and make `rate()` see a reset
on every deploy. One collector per process: the gateway binds the source it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from store.usage import Usage

#: counter field of `Usage` -> help text
FIELDS = {
    "writes": "Ops that wrote a value, since the store began (durable)",
    "deletes": "Ops that deleted a key, since the store began (durable)",
    "duplicates": "Sets equal to the stored value, not written, since the store began",
    "throttled": "Ops held or refused by the rate quota, since the store began",
    "expiries": "Keys the root expired (their deadline passed), since the store began",
}


class UsageCollector(Collector):
    """Yields the usage counters of whatever source is bound (none: nothing)."""

    def __init__(self) -> None:
        self.source: Callable[[], Mapping[str, Usage]] | None = None

    def collect(self) -> Iterator[CounterMetricFamily]:
        source = self.source
        if source is None:
            return
        usage = source()
        for name, text in FIELDS.items():
            fam = CounterMetricFamily(f"mercury_usage_{name}", text, labels=("producer",))
            for producer, u in sorted(usage.items()):
                fam.add_metric([producer], getattr(u, name))
            yield fam


COLLECTOR = UsageCollector()
REGISTRY.register(COLLECTOR)


def bind(source: Callable[[], Mapping[str, Usage]]) -> None:
    """Export the counters `source()` returns (the gateway's latest committed usage)."""
    COLLECTOR.source = source
