"""Quota properties: a token bucket never admits more than rate × time + burst."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from acl.model import Acl, Producer, Quota
from gateway.admission import Admission
from gateway.quota import Bucket, ProducerBuckets, policy

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


# --- the production path: ProducerBuckets.take (what the gateway's `admit` calls) -----------

_limits = st.one_of(st.none(), st.tuples(st.floats(0.5, 200), st.floats(1, 100)))
#: Arrival gaps: often none at all, so requests pile up and are held behind each other.
_gaps = st.one_of(st.just(0.0), st.floats(0, 0.05), st.floats(0, 0.5))
_mixed = st.lists(
    st.tuples(_gaps, st.integers(1, 20), st.integers(0, 5000)), min_size=1, max_size=120
)


def _assert_within_budget(arrivals: list[tuple[float, float, float, int]], rate: float) -> None:
    """For every arrival i and every later admitted request j: the cost of the requests
    that arrived from i to j is at most the tokens the bucket held when i arrived plus the
    refill until j is released (``tokens(s_i) + rate * (r_j - s_i)``).

    `arrivals` holds (arrival s, tokens before it at s, release r or NaN if refused, cost).
    A held request that reserved nothing would let the next one be released as early as
    itself, and the two together would overdraw this budget."""
    for i, (s_i, tokens_i, _, _) in enumerate(arrivals):
        total = 0.0
        for _, _, r_j, cost in arrivals[i:]:
            if r_j != r_j:  # refused: reserved nothing, released nothing
                continue
            total += cost
            budget = tokens_i + rate * (r_j - s_i)
            assert total <= budget + 1e-6 * (1 + total), (i, total, budget)


@given(_limits, _limits, st.floats(0, 2), _mixed)
def test_producer_buckets_never_over_admit(
    ops_limit: tuple[float, float] | None,
    bytes_limit: tuple[float, float] | None,
    max_delay: float,
    reqs: list[tuple[float, int, int]],
) -> None:
    """Held requests run at now + delay; neither bucket ever releases more than it held
    plus its refill, and a refusal reserves nothing in either bucket."""
    pb = ProducerBuckets(
        Bucket.full(*ops_limit, 0.0) if ops_limit else None,
        Bucket.full(*bytes_limit, 0.0) if bytes_limit else None,
    )
    now = 0.0
    ops_seen: list[tuple[float, float, float, int]] = []
    bytes_seen: list[tuple[float, float, float, int]] = []
    for dt, n_ops, n_bytes in reqs:
        now += dt
        expected = pb.peek(now, n_ops, n_bytes)  # also refills both buckets to `now`
        ops_tokens, bytes_tokens = pb.remaining()
        d = pb.take(now, n_ops, n_bytes, max_delay)
        if d.admitted:
            assert abs(d.delay - expected) <= 1e-9 and 0 <= d.delay <= max_delay + 1e-9
            assert d.excess == (d.delay > 0)
            release = now + d.delay
        else:
            assert d.delay == 0 and d.retry_after > 0 and d.excess
            assert pb.remaining() == (ops_tokens, bytes_tokens)  # nothing reserved
            release = float("nan")
        ops_seen.append((now, ops_tokens, release, n_ops))
        bytes_seen.append((now, bytes_tokens, release, n_bytes))
    if ops_limit:
        _assert_within_budget(ops_seen, ops_limit[0])
    if bytes_limit:
        _assert_within_budget(bytes_seen, bytes_limit[0])


def test_successive_held_requests_queue_behind_each_other() -> None:
    """Each held request reserves its tokens, so the next one waits for it too: at 10 ops/s
    with a burst of 1, four requests at once run at 0, .1, .2, .3 s (not 0, .1, .1, .1)."""
    pb = ProducerBuckets(Bucket.full(10, 1, 0.0), Bucket.full(1000, 100, 0.0))
    delays = [pb.take(0.0, 1, 10, 1.0).delay for _ in range(4)]
    assert [round(d, 9) for d in delays] == [0.0, 0.1, 0.2, 0.3]
    # the bytes bucket alone holds too: 100 bytes of burst at 1,000 B/s
    pb = ProducerBuckets(None, Bucket.full(1000, 100, 0.0))
    delays = [pb.take(0.0, 1, 100, 1.0).delay for _ in range(3)]
    assert [round(d, 9) for d in delays] == [0.0, 0.1, 0.2]


@given(
    st.floats(0.5, 1000),
    st.floats(1, 100),
    st.floats(0.5, 1000),
    st.floats(1, 100),
    st.floats(0, 100),
    st.floats(0, 10),
)
def test_a_carried_bucket_keeps_the_balance_as_of_now(
    rate: float, burst: float, rate2: float, burst2: float, spent: float, idle: float
) -> None:
    """A quota change takes over the old balance refilled up to the change: never more
    (no free refill), never less (the idle time's refill is not lost)."""
    old = Bucket.full(rate, burst, 0.0)
    old.take(0.0, spent, max_delay=1e9)
    new = Bucket.carried(old, rate2, burst2, idle)
    want = min(burst2, min(burst, burst - spent + idle * rate))
    assert abs(new.tokens - want) <= 1e-6 * (1 + abs(want))
    assert new.last == idle and new.rate == rate2 and new.burst == burst2


def _admitted_now(adm: Admission, p: Producer, n: int) -> int:
    """How many of `n` one-op requests the ops bucket admits without a hold, now."""
    b = adm._buckets[p.name].ops
    assert b is not None
    return sum(1 for _ in range(n) if b.take(time.monotonic(), 1, 0.0) == 0.0)


def test_an_acl_change_neither_refills_nor_forgets_the_idle_refill() -> None:
    """`Admission.rebuild` (every admin change): an unrelated change once reset every
    bucket to its balance at its last use, so a producer idle long enough to be full
    got 429s (and Retry-Afters that did not come true) right after it; and a quota
    removed and put back came back full."""
    p = Producer(name="p", keyspaces=("p/",), quota=Quota(ops_per_s=2, burst=4))
    other = Producer(name="o", keyspaces=("o/",))
    acl = Acl({"p": p})
    adm = Admission(acl, lambda _n, _k: None)
    assert _admitted_now(adm, p, 4) == 4  # empty now
    time.sleep(2.2)  # refills 4.4 (capped at 4) while idle
    adm.rebuild(acl.put(other))
    assert _admitted_now(adm, p, 5) == 4
    # Removed and put back at once: the empty bucket comes back, not a full one.
    adm.rebuild(Acl({"p": Producer(name="p", keyspaces=("p/",))}))
    adm.rebuild(Acl({"p": p}))
    assert _admitted_now(adm, p, 4) == 0


def test_the_ratelimit_policy_says_the_configured_rate_per_window() -> None:
    # draft-ietf-httpapi-ratelimit-headers: q units per window of w seconds
    assert policy(50, 100) == (100, 2)  # 50/s, burst 100: not q=100;w=1 (100/s)
    assert policy(1000, 2000) == (2000, 2)
    assert policy(20, 20) == (20, 1)
    assert policy(0.5, 1) == (1, 2)


@given(st.integers(1, 10_000), st.integers(1, 50))
def test_the_policy_rate_is_exact_when_the_burst_is_whole_seconds_of_it(
    rate: int, seconds: int
) -> None:
    q, w = policy(rate, rate * seconds)
    assert (q, w) == (rate * seconds, seconds) and q / w == rate


@given(st.floats(0.1, 10_000), st.floats(1, 100_000))
def test_the_policy_window_is_the_bucket_depth_and_its_rate_the_configured_one(
    rate: float, burst: float
) -> None:
    q, w = policy(rate, burst)
    assert w >= 1
    assert w == 1 or abs(w - burst / rate) <= 0.5  # a window under 1 s is 1 s
    assert abs(q - rate * w) <= 0.5 or q == 1  # whole units: rounded, never a tenfold
