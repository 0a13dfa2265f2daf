"""Admission by rate quota: token buckets per producer, a bounded hold, then 429.

A request over its producer's quota is held (an `asyncio.sleep` of that request only: a
held producer never delays another) up to ``max_delay_ms``; beyond that it is refused
with 429 and ``Retry-After``. Shadow quotas count the excess without enforcing it.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from acl.model import Acl, Producer
from core.errors import QuotaExceededError
from gateway import metrics
from gateway.quota import Bucket, ProducerBuckets


class Admission:
    """The token buckets of every producer with a rate quota."""

    def __init__(self, acl: Acl, note_throttled: Callable[[str, int], None]) -> None:
        #: Counts throttled ops for the usage counters (stored with the next batch).
        self._note_throttled = note_throttled
        self._buckets: dict[str, ProducerBuckets] = {}
        self.rebuild(acl)

    def rebuild(self, acl: Acl) -> None:
        """Buckets for `acl`'s quotas, keeping each current balance (a change never refills)."""
        now = time.monotonic()
        buckets = {}
        for name, p in acl.producers.items():
            q = p.quota
            old = self._buckets.get(name)
            ops = Bucket.full(q.ops_per_s, q.burst or q.ops_per_s, now) if q.ops_per_s else None
            nb = (
                Bucket.full(q.bytes_per_s, q.bytes_burst or q.bytes_per_s, now)
                if q.bytes_per_s
                else None
            )
            if old is not None and old.ops is not None and ops is not None:
                ops.tokens = min(ops.burst, old.ops.tokens)
            if old is not None and old.bytes is not None and nb is not None:
                nb.tokens = min(nb.burst, old.bytes.tokens)
            buckets[name] = ProducerBuckets(ops, nb)
        self._buckets = buckets

    def rate_headers(self, p: Producer) -> dict[str, str]:
        """RateLimit-Policy / RateLimit headers (IETF draft syntax) of `p`'s quota."""
        b = self._buckets.get(p.name)
        q = p.quota
        if b is None or (b.ops is None and b.bytes is None):
            return {}
        pol, cur = [], []
        if b.ops is not None and q.ops_per_s:
            pol.append(f'"ops";q={int(b.ops.burst)};w=1')
            left = max(0, int(b.ops.tokens))
            reset = max(0.0, (b.ops.burst - b.ops.tokens) / b.ops.rate)
            cur.append(f'"ops";r={left};t={math.ceil(reset)}')
        if b.bytes is not None and q.bytes_per_s:
            pol.append(f'"bytes";q={int(b.bytes.burst)};w=1')
            left = max(0, int(b.bytes.tokens))
            reset = max(0.0, (b.bytes.burst - b.bytes.tokens) / b.bytes.rate)
            cur.append(f'"bytes";r={left};t={math.ceil(reset)}')
        return {"RateLimit-Policy": ", ".join(pol), "RateLimit": ", ".join(cur)}

    async def admit(self, p: Producer, n_ops: int, n_bytes: int) -> dict[str, str]:
        """Hold the request until `p`'s quota admits it; 429 beyond max_delay_ms.

        Returns the headers a throttled answer carries (empty when not throttled).
        """
        b = self._buckets.get(p.name)
        if b is None or (b.ops is None and b.bytes is None):
            return {}
        q = p.quota
        d = b.take(time.monotonic(), n_ops, n_bytes, q.max_delay_ms / 1000.0)
        if not d.excess:
            return {}
        self._note_throttled(p.name, n_ops)
        if q.shadow:
            return {}  # counted, not enforced
        headers = self.rate_headers(p)
        if not d.admitted:
            retry = max(1, math.ceil(d.retry_after))
            headers["Retry-After"] = str(retry)
            metrics.WRITE_OPS.labels(p.name, "throttled").inc(n_ops)
            raise QuotaExceededError(
                f"producer {p.name!r} is over its write quota; retry after {retry} s",
                producer=p.name,
                retry_after=retry,
                headers=headers,
            )
        metrics.QUOTA_DELAY.labels(p.name).observe(d.delay)
        await asyncio.sleep(d.delay)
        return headers
