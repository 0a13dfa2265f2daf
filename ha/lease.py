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
#: The lease TTL of `--lease-ttl-s` unless told otherwise. A failover takes about this plus
#: 2 s (the lease expires, a standby wins on its next poll, its root starts serving); the
#: SDK's default retry budget (`mercury_client.retry.DEFAULT_BUDGET_S`) outlasts that.
DEFAULT_TTL_S = 5


def margin_for(ttl_s: float) -> float:
    """Safety margin for a lease of `ttl_s`: a fifth of it, at least `MIN_MARGIN_S`, at
    most half of it (a 1 s lease keeps half a second to acknowledge in)."""
    return min(max(MIN_MARGIN_S, ttl_s / 5), ttl_s / 2)


def renew_interval(ttl_s: float) -> float:
    """How often to send keep-alives: three chances before the margin is reached."""
    return max(0.1, (ttl_s - margin_for(ttl_s)) / 3)


def renewing(left_s: int, granted_s: int) -> bool:
    """Whether a lease etcd says has `left_s` of its `granted_s` seconds left is still
    being renewed by its holder, as far as another node can tell.

    A live holder renews every `renew_interval`, so the lease never has less than
    ``granted - renew_interval`` left; etcd reports whole seconds (rounded down), and one
    keep-alive may be late (in flight, or a busy loop), hence the extra interval and second.
    Below that the holder missed renewals: it is dead or cut from etcd, and the lease will
    expire (an election follows) rather than be renewed. A standby never sends clients to
    a leader whose lease is not renewing (`ha.role.may_route`)."""
    return left_s > 0 and left_s >= granted_s - 2 * renew_interval(granted_s) - 1


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
