"""When to retry and how long to wait: pure decisions, the clock and the dice passed in.

Backoff is exponential with full jitter (a uniformly random wait between 0 and
``min(cap, base * 2**attempt)``), so a crowd of clients that failed together does not come
back together. When the node says how long to wait (``Retry-After`` on 429/503, or the
reset time ``t=`` of the ``RateLimit`` header), that wait is honoured: the client waits at
least that long, plus up to 10 % so the crowd still spreads out.

A policy may also have a **budget**: tries go on past `attempts` until the waits between
them add up to `budget_s`. The clients' default (`DEFAULT_POLICY`) has one that outlasts an
HA failover, so a write sent while the leader dies is answered by the next one instead of
raising. The budget counts the waits, not the wall clock, so that a test's own `sleep`
measures it too.
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

#: Answers worth retrying unchanged: over quota now, or the node is passing through trouble.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: ... of which the ones that say the request was not applied (the root refused it before
#: any write): the only ones retried for a write sent without an Idempotency-Key. A 502 or
#: 504 comes from a proxy that may have passed the request on.
RETRY_UNAPPLIED = frozenset({429, 503})
#: Answers after which the next try goes to another of the client's URLs (an HA candidate
#: may be dead, electing, or unable to confirm its leader); a 429 is the leader's own word.
MOVE_ON = frozenset({502, 503, 504})

#: The default lease TTL of an HA group (`mercury root --lease-ttl-s`, `ha.lease.DEFAULT_TTL_S`;
#: the SDK imports no server package, `tests/client/test_route.py` holds the two
#: equal). A failover takes about the TTL + 2 s.
HA_LEASE_TTL_S = 5
#: The default retry budget: twice that failover, so that a loaded machine's slow one
#: (up to 8.5 s measured, bench/README.md) is outlasted too.
DEFAULT_BUDGET_S = 2.0 * (HA_LEASE_TTL_S + 2)


def retryable(status: int, safe: bool) -> bool:
    """Whether an answer with `status` may be retried; `safe`: repeating the request can do
    no harm (a read, or a write carrying an Idempotency-Key)."""
    return status in (RETRY_STATUSES if safe else RETRY_UNAPPLIED)


_T = re.compile(r"(?:^|;)\s*t=(\d+(?:\.\d+)?)")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` tries in all (1 = no retry), and more while the waits so far are under
    `budget_s` seconds; backoff between `base` and `cap` seconds; a server-advised wait
    longer than `max_wait` is not waited for (the error is raised)."""

    attempts: int = 6
    base: float = 0.1
    cap: float = 10.0
    max_wait: float = 120.0
    budget_s: float = 0.0

    def backoff(self, attempt: int, rand: Callable[[], float]) -> float:
        """Full-jitter wait after failed try number `attempt` (0-based)."""
        return rand() * min(self.cap, self.base * (2.0 ** min(attempt, 60)))

    def wait(
        self,
        attempt: int,
        headers: Mapping[str, str],
        rand: Callable[[], float],
        waited: float = 0.0,
    ) -> float | None:
        """Seconds to wait before the next try, or None when no retry is left (or the
        server asks for more than `max_wait`); `waited`: seconds already waited between
        this call's tries."""
        if self.attempts <= 1 or (attempt + 1 >= self.attempts and waited >= self.budget_s):
            return None
        hint = server_wait(headers)
        if hint is None:
            return self.backoff(attempt, rand)
        if hint > self.max_wait:
            return None
        return hint * (1.0 + 0.1 * rand())


def server_wait(headers: Mapping[str, str], now: float | None = None) -> float | None:
    """The wait the server asked for: ``Retry-After`` (seconds or an HTTP date), else the
    longest reset ``t=`` of the ``RateLimit`` header; None when it said nothing usable.
    Header names are matched case-insensitively."""
    lower = {k.lower(): v for k, v in headers.items()}
    ra = lower.get("retry-after")
    if ra is not None:
        ra = ra.strip()
        try:
            return max(0.0, float(ra))
        except ValueError:
            pass
        try:
            when = email.utils.parsedate_to_datetime(ra).timestamp()
        except (TypeError, ValueError):
            when = None
        if when is not None:
            return max(0.0, when - (time.time() if now is None else now))
    rl = lower.get("ratelimit")
    if rl:
        resets = [float(m.group(1)) for item in rl.split(",") if (m := _T.search(item))]
        if resets:
            return max(resets)
    return None


#: What `Client` and `AsyncClient` retry with unless told otherwise: 6 tries at least, and
#: on while the waits are under `DEFAULT_BUDGET_S` (one HA failover).
DEFAULT_POLICY = RetryPolicy(budget_s=DEFAULT_BUDGET_S)
