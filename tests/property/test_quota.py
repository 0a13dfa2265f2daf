"""Quota properties: a token bucket never admits more than rate × time + burst."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.quota import Bucket, ProducerBuckets

requests = st.lists(st.tuples(st.floats(0, 0.5), st.integers(1, 20)), min_size=1, max_size=200)


@given(st.floats(0.5, 1000), st.floats(1, 100), st.floats(0, 2), requests)
def test_bucket_never_over_admits(
    rate: float, burst: float, max_delay: float, reqs: list[tuple[float, int]]
) -> None:
    t0 = 100.0
    b = Bucket.full(rate, burst, t0)
    now = t0
    released: list[tuple[float, int]] = []  # (time the request runs, cost)
    for dt, cost in reqs:
        now += dt
        d = b.take(now, cost, max_delay)
        if d is not None:
            assert 0 <= d <= max_delay + 1e-9
            released.append((now + d, cost))
    released.sort()
    total = 0.0
    for t, cost in released:
        total += cost
        assert total <= burst + rate * (t - t0) + 1e-6 * (1 + total)


@given(st.floats(1, 100), st.floats(1, 100), st.lists(st.floats(0, 1), max_size=50))
def test_refused_requests_reserve_nothing(rate: float, burst: float, gaps: list[float]) -> None:
    pb = ProducerBuckets(Bucket.full(rate, burst, 0.0), None)
    now = 0.0
    for g in gaps:
        now += g
        before = pb.ops.tokens if pb.ops else 0.0
        d = pb.take(now, 1_000_000, 0, 0.0)
        assert not d.admitted and d.retry_after > 0
        assert pb.ops is not None and pb.ops.tokens >= before  # only refill, no reservation


def test_requests_over_the_burst_are_held_not_refused_when_delay_allows() -> None:
    pb = ProducerBuckets(Bucket.full(10, 1, 0.0), None)
    assert pb.take(0.0, 1, 0, 1.0).delay == 0
    d = pb.take(0.0, 1, 0, 1.0)
    assert d.admitted and abs(d.delay - 0.1) < 1e-9 and d.excess
