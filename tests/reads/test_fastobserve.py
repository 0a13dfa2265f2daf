"""`BatchedObserve` records exactly what `Histogram.observe` records: same buckets, count
and sum at every collection, whether or not a batch was full."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from reads.fastobserve import FLUSH_EVERY, BatchedObserve

BUCKETS = (0.00002, 0.0001, 0.001, 0.01, 1.0)


def _samples(registry: CollectorRegistry, op: str) -> dict[str, float]:
    out = {}
    for fam in registry.collect():
        for s in fam.samples:
            if s.labels.get("op") == op and not s.name.endswith("_created"):
                out[s.name + str(sorted(s.labels.items()))] = s.value
    return out


@given(
    st.lists(
        st.one_of(
            st.sampled_from(BUCKETS),  # exactly on a bound: goes to that bucket
            st.floats(min_value=0, max_value=5, allow_nan=False),
        ),
        max_size=3 * FLUSH_EVERY,
    )
)
def test_batched_equals_observe(values: list[float]) -> None:
    registry = CollectorRegistry()
    hist = Histogram("t_seconds", "t", ["op"], buckets=BUCKETS, registry=registry)
    batched = BatchedObserve(hist, "batched")
    plain = hist.labels("plain").observe
    for v in values:
        batched(v)
        plain(v)
    got = {k.replace("batched", "x"): v for k, v in _samples(registry, "batched").items()}
    want = {k.replace("plain", "x"): v for k, v in _samples(registry, "plain").items()}
    assert got.keys() == want.keys()
    for k in got:  # counts exactly; the sum up to float rounding (added in another order)
        assert got[k] == (pytest.approx(want[k]) if "_sum" in k else want[k]), k
