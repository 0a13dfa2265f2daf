"""Admission by rate quota: token buckets per producer, a bounded hold, then 429.

A request over its producer's quota is held (an `asyncio.sleep` of that request only: a
held producer never delays another) up to ``max_delay_ms``; beyond that it is refused
with 429 and a ``Retry-After`` after which the same request is admitted if nothing else
spends the quota meanwhile. A request no wait can admit (more ops or bytes than
``burst + rate * max_delay``) is refused with 413 naming the largest admissible request
(``max_ops``, ``max_bytes``), never with a Retry-After. Shadow quotas count the excess
without enforcing it. Held, refused (429) and too-large (413) ops are counted apart.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from acl.model import Acl, Producer
from core.errors import QuotaExceededError, TooLargeError
from gateway import metrics
from gateway.quota import Bucket, ProducerBuckets, policy, retry_seconds

#: The outcomes of a request over its quota, counted apart (`Admission.counts`).
OUTCOMES = ("held", "refused", "too_large", "shadow")


class Admission:
    """The token buckets of every producer with a rate quota."""

    def __init__(self, acl: Acl, note_throttled: Callable[[str, int], None]) -> None:
        #: Counts throttled ops for the usage counters (stored with the next batch).
        self._note_throttled = note_throttled
        self._buckets: dict[str, ProducerBuckets] = {}
        #: The last bucket of a producer whose quota was removed, by kind (``ops``,
        #: ``bytes``): putting the quota back resumes that balance, not a full bucket.
        self._retired: dict[tuple[str, str], Bucket] = {}
        #: Ops per producer and outcome (`OUTCOMES`) since this process started.
        self.counts: dict[str, dict[str, int]] = {}
        self.rebuild(acl)

    def rebuild(self, acl: Acl) -> None:
        """Buckets for `acl`'s quotas, each keeping its current balance as of now
        (`Bucket.carried`): a change — of this producer or of any other — never refills a
        bucket, and never forgets what the time since its last use refilled."""
        now = time.monotonic()
        buckets = {}
        retired: dict[tuple[str, str], Bucket] = {}
        for name, p in acl.producers.items():
            q = p.quota
            old = self._buckets.get(name)
            new: dict[str, Bucket | None] = {}
            for kind, rate, burst in (
                ("ops", q.ops_per_s, q.burst),
                ("bytes", q.bytes_per_s, q.bytes_burst),
            ):
                before = getattr(old, kind) if old is not None else None
                if before is None:
                    before = self._retired.get((name, kind))
                if rate:
                    new[kind] = Bucket.carried(before, rate, burst or rate, now)
                else:
                    new[kind] = None
                    if before is not None:
                        retired[(name, kind)] = before
            buckets[name] = ProducerBuckets(new["ops"], new["bytes"])
        self._buckets = buckets
        self._retired = retired  # a producer no longer in the ACL is forgotten

    def rate_headers(self, p: Producer, waits: tuple[float, float] | None = None) -> dict[str, str]:
        """RateLimit-Policy / RateLimit headers (IETF draft syntax) of `p`'s quota.

        `t` is the seconds until the bucket is full again; on a refusal (`waits` given) it
        is instead the seconds until that quota admits the refused request, so the
        largest `t` equals the Retry-After.
        """
        b = self._buckets.get(p.name)
        q = p.quota
        if b is None or (b.ops is None and b.bytes is None):
            return {}
        pol, cur = [], []
        for name, bucket, limited, wait in (
            ("ops", b.ops, q.ops_per_s, waits[0] if waits else None),
            ("bytes", b.bytes, q.bytes_per_s, waits[1] if waits else None),
        ):
            if bucket is None or not limited:
                continue
            quota, window = policy(bucket.rate, bucket.burst)
            pol.append(f'"{name}";q={quota};w={window}')
            left = max(0, int(bucket.tokens))
            if wait is None:
                t = math.ceil(max(0.0, (bucket.burst - bucket.tokens) / bucket.rate))
            else:
                t = retry_seconds(wait) if wait > 0 else 0
            cur.append(f'"{name}";r={left};t={t}')
        return {"RateLimit-Policy": ", ".join(pol), "RateLimit": ", ".join(cur)}

    def _count(self, producer: str, outcome: str, n_ops: int) -> None:
        row = self.counts.setdefault(producer, dict.fromkeys(OUTCOMES, 0))
        row[outcome] += n_ops
        metrics.QUOTA_OPS.labels(producer, outcome).inc(n_ops)

    def largest(self, p: Producer) -> tuple[int | None, int | None]:
        """(ops, bytes) of the largest request `p`'s quota can ever admit; None where it
        sets no bound (no quota, or a shadow one, which never refuses)."""
        b = self._buckets.get(p.name)
        if b is None or p.quota.shadow:
            return None, None
        return b.largest(p.quota.max_delay_ms / 1000.0)

    async def admit(self, p: Producer, n_ops: int, n_bytes: int) -> dict[str, str]:
        """Hold the request until `p`'s quota admits it; 429 beyond max_delay_ms.

        Returns the headers a throttled answer carries (empty when not throttled).
        """
        b = self._buckets.get(p.name)
        if b is None or (b.ops is None and b.bytes is None):
            return {}
        q = p.quota
        max_delay = q.max_delay_ms / 1000.0
        d = b.take(time.monotonic(), n_ops, n_bytes, max_delay)
        if not d.excess:
            return {}
        self._note_throttled(p.name, n_ops)
        if q.shadow:
            self._count(p.name, "shadow", n_ops)
            return {}  # counted, not enforced
        if d.never:
            self._count(p.name, "too_large", n_ops)
            max_ops, max_bytes = b.largest(max_delay)
            raise TooLargeError(
                f"a request of {n_ops} ops and {n_bytes} bytes can never pass producer "
                f"{p.name!r}'s write quota (burst + rate x max_delay); split it",
                producer=p.name,
                ops=n_ops,
                bytes=n_bytes,
                max_ops=max_ops,
                max_bytes=max_bytes,
                hint="send at most max_ops ops and max_bytes bytes (key + value) per request",
            )
        if not d.admitted:
            retry = retry_seconds(d.retry_after)
            headers = self.rate_headers(p, d.waits)
            headers["Retry-After"] = str(retry)
            self._count(p.name, "refused", n_ops)
            metrics.WRITE_OPS.labels(p.name, "throttled").inc(n_ops)
            raise QuotaExceededError(
                f"producer {p.name!r} is over its write quota; retry after {retry} s",
                producer=p.name,
                retry_after=retry,
                headers=headers,
            )
        headers = self.rate_headers(p)
        self._count(p.name, "held", n_ops)
        metrics.QUOTA_DELAY.labels(p.name).observe(d.delay)
        await asyncio.sleep(d.delay)
        return headers
