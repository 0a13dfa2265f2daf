"""When a leader may acknowledge writes: the lease clock (pure, monotonic seconds).

etcd expires a lease TTL seconds after the last keep-alive it received. A keep-alive sent at
`t` cannot have reached etcd before `t`, so the lease is alive at least until `t + TTL`;
a leader acknowledges only until `t + TTL - margin` for the last keep-alive that succeeded.
The margin covers clock-rate differences between this host and etcd's and the time between
checking the deadline and the acknowledgement leaving the socket. A leader that cannot renew
therefore stops acknowledging before etcd can let anyone else win the election.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Smallest margin (seconds) whatever the TTL.
MIN_MARGIN_S = 0.5


def margin_for(ttl_s: float) -> float:
    """Safety margin for a lease of `ttl_s`: a fifth of it, at least `MIN_MARGIN_S`, at
    most half of it (a 1 s lease keeps half a second to acknowledge in)."""
    return min(max(MIN_MARGIN_S, ttl_s / 5), ttl_s / 2)


def renew_interval(ttl_s: float) -> float:
    """How often to send keep-alives: three chances before the margin is reached."""
    return max(0.1, (ttl_s - margin_for(ttl_s)) / 3)


@dataclass(slots=True)
class LeaseClock:
    """The acknowledgement deadline of one lease."""

    margin_s: float
    #: monotonic time until which acknowledging is safe (0: never renewed, or lost)
    deadline: float = 0.0

    def renewed(self, sent_at: float, ttl_s: float) -> None:
        """A keep-alive sent at `sent_at` (monotonic) succeeded with `ttl_s` left."""
        if ttl_s <= 0:
            self.lost()
            return
        self.deadline = max(self.deadline, sent_at + ttl_s - self.margin_s)

    def lost(self) -> None:
        """The lease expired or was revoked: stop at once."""
        self.deadline = 0.0

    def valid(self, now: float) -> bool:
        """Whether acknowledging at `now` (monotonic) is safe."""
        return now < self.deadline

    def left(self, now: float) -> float:
        """Seconds of safe acknowledging left (negative once past)."""
        return self.deadline - now
