"""The rule of where a standby sends clients (`ha.role.may_route`) and the lease reading it
rests on (`ha.lease.renewing`)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ha.lease import renew_interval, renewing
from ha.role import LeaderInfo, Role, View, may_route

LEADER = LeaderInfo("a", "http://a:8080", "a:7070", 7)


def test_route_only_to_a_confirmed_leader() -> None:
    standby = View(Role.STANDBY, LEADER)
    assert may_route(standby, lease_renewing=True, link_lost=False)
    # A dead leader's key outlives it: neither a stale lease nor a broken link is routed to.
    assert not may_route(standby, lease_renewing=False, link_lost=False)
    assert not may_route(standby, lease_renewing=True, link_lost=True)
    assert not may_route(View(Role.ELECTING, None), lease_renewing=True, link_lost=False)
    # A candidate that won but whose root does not serve yet sends nobody to itself.
    assert not may_route(View(Role.LEADER, LEADER), lease_renewing=True, link_lost=False)


@given(st.integers(2, 60), st.floats(0, 1))
def test_a_lease_renewed_on_time_or_one_late_is_renewing(ttl: int, frac: float) -> None:
    # Any moment up to two renewal intervals after the last keep-alive, as etcd reports it
    # (whole seconds, rounded down; etcd grants no lease under 2 s).
    since = frac * 2 * renew_interval(ttl)
    assert renewing(math.floor(ttl - since), ttl)


@given(st.integers(5, 60))
def test_a_lease_nobody_renews_stops_renewing_before_it_expires(ttl: int) -> None:
    # From the default TTL up, at least its last second (shorter leases expire about as
    # soon: there the broken replication link is what stops the redirects).
    assert not renewing(1, ttl)
    assert not renewing(0, ttl) and not renewing(-1, ttl)
