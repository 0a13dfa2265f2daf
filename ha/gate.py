"""The rule that decides whether a committed batch may be acknowledged (pure).

An HA leader answers a write only once the batch holding it is durable where a failover
would find it: on `required` standbys that reported applying it, and while this node's
leadership lease is still valid. A batch that waited the sync timeout without enough
reports gets a 503 that says so (it may or may not survive a failover); one committed
after the lease could no longer be renewed gets `NotLeaderError`.
"""

from __future__ import annotations

from ha.errors import NotInSyncError, NotLeaderError
from ha.lease import LeaseClock
from ha.syncack import SyncTracker


def ack_verdict(
    tracker: SyncTracker,
    clock: LeaseClock,
    seq: int,
    waited_s: float,
    timeout_s: float,
    now: float,
) -> bool | Exception:
    """Whether batch `seq`, committed `waited_s` ago, may be acknowledged at `now` (True),
    must wait for a report (False), or gets the error to answer (not acknowledged)."""
    if tracker.synced_seq(now) < seq:
        if waited_s < timeout_s:
            return False
        n = tracker.in_sync(now)
        return NotInSyncError(
            f"committed on the leader at seq {seq} but not confirmed by "
            f"{tracker.required} standby(s) within {timeout_s * 1000:g} ms "
            f"({n} in sync): not acknowledged; it may or may not survive a failover"
        )
    if not clock.valid(now):
        return NotLeaderError(
            f"committed at seq {seq} but this node's leadership lease could not be "
            "renewed in time: not acknowledged"
        )
    return True
