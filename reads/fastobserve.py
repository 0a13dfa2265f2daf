"""A cheap `observe` for the point-read hot paths' latency histogram.

`Histogram.observe` of prometheus_client takes a lock per value and walks the bucket
bounds in Python: about 2.5 µs, a tenth of a whole point read on the fast paths. A
`BatchedObserve` counts into plain Python numbers instead (one `bisect`, about 0.3 µs) and
folds the counts into the histogram's child every `FLUSH_EVERY` observations, and before
every collection of the histogram (each scrape, in whatever registry or process view):
what a scrape sees is exactly what was observed. The bucket rule is the histogram's own
(a value goes to the first bucket whose upper bound is >= it).

It reaches into the child's bucket and sum values (`_upper_bounds`, `_buckets`, `_sum`),
prometheus_client's layout since 0.4; `tests/reads/test_fastobserve.py` pins it by
comparing with `observe` on the same values.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import Histogram

#: Observations kept before they are folded into the histogram (a scrape folds them too).
FLUSH_EVERY = 256


class BatchedObserve:
    """`observe(v)` for one labelled child of `hist`, batched (module docstring). Call it
    from one thread (the read server's event loop)."""

    def __init__(self, hist: Histogram, *labels: str) -> None:
        self.child: Any = hist.labels(*labels)
        self.bounds: list[float] = list(self.child._upper_bounds)
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.n = 0
        batches: list[BatchedObserve] | None = getattr(hist, "_mercury_batches", None)
        if batches is None:
            batches = []
            hist._mercury_batches = batches  # type: ignore[attr-defined]
            _fold_before_collect(hist, batches)
        batches.append(self)

    def __call__(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1
        if self.n >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        """Fold the pending observations into the histogram."""
        if not self.n:
            return
        counts, total = self.counts, self.total
        self.counts, self.total, self.n = [0] * len(self.bounds), 0.0, 0
        buckets = self.child._buckets
        for i, c in enumerate(counts):
            if c:
                buckets[i].inc(c)
        self.child._sum.inc(total)


def _fold_before_collect(hist: Histogram, batches: list[BatchedObserve]) -> None:
    collect = hist.collect

    def collect_folded() -> Any:
        for b in batches:
            b.flush()
        return collect()

    hist.collect = collect_folded  # type: ignore[method-assign]
