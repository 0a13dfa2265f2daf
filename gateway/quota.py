"""Token buckets for write quotas: pure arithmetic, the clock passed in.

A bucket holds up to `burst` tokens and refills at `rate` per second. `take(now, cost)`
reserves `cost` tokens and answers how long the request must be *held* before it may run:
the balance may go negative (a debt) and the delay is the time the refill needs to pay it.
A request whose delay would exceed `max_delay` is refused and reserves nothing.

Invariant (tested by hypothesis): the cost released by time T (each request counted at
now + delay) never exceeds ``burst + rate * (T - t0)``.

A request costlier than ``burst + rate * max_delay`` can never be admitted (even a full
bucket would hold it too long): `ProducerBuckets.take` says so (`Decision.never`) instead
of a Retry-After that would never come true, and `largest` names the biggest admissible
request. For any other refusal, waiting `retry_after` admits the same request in an
otherwise idle system (also tested by hypothesis).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Float slack of the delay comparison: a request refused for `retry_after` seconds and
#: retried exactly that much later must not be refused again by a rounding error.
EPSILON = 1e-9


@dataclass(slots=True)
class Bucket:
    """One token bucket. Not thread-safe (the gateway uses it on its event loop)."""

    rate: float
    burst: float
    tokens: float
    last: float

    @classmethod
    def full(cls, rate: float, burst: float, now: float) -> Bucket:
        """A bucket that starts full at time `now`."""
        return cls(rate, burst, burst, now)

    @classmethod
    def carried(cls, old: Bucket | None, rate: float, burst: float, now: float) -> Bucket:
        """A bucket of `rate` and `burst` that takes over `old`'s balance as of `now` (its
        refill up to `now` included, capped at the new `burst`): a quota change neither
        refills the bucket nor takes back what the time since `old`'s last use earned.
        Full when there is no `old`."""
        if old is None:
            return cls.full(rate, burst, now)
        old._refill(now)
        return cls(rate, burst, min(burst, old.tokens), now)

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now

    def largest(self, max_delay: float) -> int:
        """The largest cost this bucket can ever admit with holds up to `max_delay`."""
        return math.floor(self.burst + self.rate * max_delay + EPSILON)

    def delay_for(self, now: float, cost: float) -> float:
        """Seconds a request of `cost` would wait if taken now (0 when it fits)."""
        self._refill(now)
        short = cost - self.tokens
        return short / self.rate if short > 0 else 0.0

    def take(self, now: float, cost: float, max_delay: float) -> float | None:
        """Reserve `cost`; return the hold time in seconds, or None (refused, nothing
        reserved) when it would exceed `max_delay`."""
        d = self.delay_for(now, cost)
        if d > max_delay + EPSILON:
            return None
        self.tokens -= cost
        return d


@dataclass(slots=True)
class Decision:
    """Outcome of a quota check: `delay` seconds to hold (admitted) or `retry_after`
    seconds (refused); `excess` says whether the request was over budget at all; `never`
    that no wait can admit it (too costly for the quota; `retry_after` is then infinite).
    `waits` is the (ops, bytes) seconds until each bucket alone would admit the request
    (what a refusal's RateLimit header reports; 0 when that bucket does not limit it)."""

    admitted: bool
    delay: float
    retry_after: float
    excess: bool
    never: bool = False
    waits: tuple[float, float] = (0.0, 0.0)


def policy(rate: float, burst: float) -> tuple[int, int]:
    """(q, w) of a ``RateLimit-Policy`` item for a bucket of `rate` per second and depth
    `burst` (draft-ietf-httpapi-ratelimit-headers: `q` units per window of `w` seconds).

    The window is the bucket's depth in seconds, ``burst / rate``, in whole seconds (at
    least 1), and `q` what the rate admits in it: so `q / w` says the configured rate and
    `q` the burst (exactly when both divide: 50/s with a burst of 100 is ``q=100;w=2``).
    `q=burst;w=1` would claim the burst every second: twice the rate for that producer.
    """
    w = max(1, round(burst / rate))
    return max(1, round(rate * w)), w


def retry_seconds(wait: float) -> int:
    """Whole seconds of a Retry-After for a `wait` (at least 1: never "retry now")."""
    return max(1, math.ceil(wait - EPSILON))


@dataclass(slots=True)
class ProducerBuckets:
    """The ops and bytes buckets of one producer (either may be absent = unlimited)."""

    ops: Bucket | None
    bytes: Bucket | None

    def largest(self, max_delay: float) -> tuple[int | None, int | None]:
        """(ops, bytes) of the largest request ever admissible (None = unlimited)."""
        return (
            self.ops.largest(max_delay) if self.ops else None,
            self.bytes.largest(max_delay) if self.bytes else None,
        )

    def take(self, now: float, n_ops: int, n_bytes: int, max_delay: float) -> Decision:
        """Admit `n_ops` ops of `n_bytes` bytes together, or refuse both (all or nothing)."""
        max_ops, max_bytes = self.largest(max_delay)
        if (max_ops is not None and n_ops > max_ops) or (
            max_bytes is not None and n_bytes > max_bytes
        ):
            inf = float("inf")
            return Decision(False, 0.0, inf, True, never=True, waits=(inf, inf))
        d_ops = self.ops.delay_for(now, n_ops) if self.ops else 0.0
        d_bytes = self.bytes.delay_for(now, n_bytes) if self.bytes else 0.0
        d = max(d_ops, d_bytes)
        if d > max_delay + EPSILON:
            waits = (max(0.0, d_ops - max_delay), max(0.0, d_bytes - max_delay))
            return Decision(False, 0.0, d - max_delay, True, waits=waits)
        if self.ops:
            self.ops.tokens -= n_ops
        if self.bytes:
            self.bytes.tokens -= n_bytes
        return Decision(True, d, 0.0, d > 0)

    def peek(self, now: float, n_ops: int, n_bytes: int) -> float:
        """Delay a request would get, without reserving (for shadow mode)."""
        d_ops = self.ops.delay_for(now, n_ops) if self.ops else 0.0
        d_bytes = self.bytes.delay_for(now, n_bytes) if self.bytes else 0.0
        return max(d_ops, d_bytes)

    def remaining(self) -> tuple[float, float]:
        """(ops tokens, bytes tokens) left now (inf when unlimited), for RateLimit headers."""
        inf = float("inf")
        return (
            self.ops.tokens if self.ops else inf,
            self.bytes.tokens if self.bytes else inf,
        )
