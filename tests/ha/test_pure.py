"""The pure HA rules: lease deadline, role decision, sync acknowledgement, term fencing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ha.lease import LeaseClock, margin_for, renew_interval
from ha.role import (
    LeaderInfo,
    Role,
    decide,
    decode_progress,
    encode_progress,
    may_campaign,
)
from ha.syncack import SyncTracker
from store.terms import StaleTermError, TermGuard, decode_term, term_fields


def test_deadline_is_send_time_plus_ttl_minus_margin() -> None:
    c = LeaseClock(margin_s=margin_for(5))
    assert not c.valid(0.0)
    c.renewed(sent_at=10.0, ttl_s=5)
    assert c.deadline == 14.0
    assert c.valid(13.9) and not c.valid(14.0)
    c.renewed(sent_at=9.0, ttl_s=5)  # a late answer to an older keep-alive never shortens
    assert c.deadline == 14.0
    c.renewed(sent_at=11.0, ttl_s=0)  # etcd says expired: stop at once
    assert not c.valid(11.0)


@given(st.floats(0.5, 120))
def test_margin_and_renewal_fit_inside_the_ttl(ttl: float) -> None:
    m = margin_for(ttl)
    assert 0 < m <= ttl / 2
    # three renewals fit before the margin is reached
    assert 3 * renew_interval(ttl) <= ttl - m + 1e-9 or renew_interval(ttl) == 0.1


def test_role_needs_the_key_on_my_own_live_lease() -> None:
    me = LeaderInfo("a", "http://a", "a:1", 7)
    other = LeaderInfo("b", "http://b", "b:1", 9)
    assert decide("a", 1, None, 0, True).role is Role.ELECTING
    assert decide("a", 1, me, 1, True).role is Role.LEADER
    assert decide("a", 1, me, 1, True).term == 7
    assert decide("a", 1, me, 1, False).role is Role.ELECTING  # cannot renew: not leading
    assert decide("a", 2, me, 1, True).role is Role.STANDBY  # my old process's key
    v = decide("a", 1, other, 5, True)
    assert v.role is Role.STANDBY and v.leader == other
    assert not may_campaign(has_store=False, lease_valid=True, mine=(1, 5), others=[])
    assert may_campaign(has_store=True, lease_valid=True, mine=(1, 5), others=[(1, 5), (1, 3)])
    assert not may_campaign(has_store=True, lease_valid=True, mine=(1, 5), others=[(1, 6)])
    assert not may_campaign(has_store=True, lease_valid=False, mine=(1, 5), others=[])
    # a deposed leader's unacknowledged tail: higher seq, older term: the standby wins
    assert may_campaign(has_store=True, lease_valid=True, mine=(9, 105), others=[(3, 110)])
    assert not may_campaign(has_store=True, lease_valid=True, mine=(3, 110), others=[(9, 105)])
    assert decode_progress(encode_progress((9, 105))) == (9, 105)


def test_leader_info_round_trip() -> None:
    info = LeaderInfo("n", "http://127.0.0.1:1", "127.0.0.1:2", 0)
    assert LeaderInfo.decode(info.encode(), 42) == LeaderInfo(
        "n", "http://127.0.0.1:1", "127.0.0.1:2", 42
    )
    with pytest.raises(ValueError):
        LeaderInfo.decode(b"nope", 1)


def test_sync_needs_n_fresh_standbys() -> None:
    t = SyncTracker(required=1, fresh_s=2.0)
    assert t.synced_seq(0.0) == 0
    t.applied(b"s1", 10, now=0.0)
    assert t.synced_seq(1.0) == 10
    assert t.synced_seq(2.5) == 0  # silent too long: not in sync
    t2 = SyncTracker(required=2, fresh_s=2.0)
    t2.applied(b"s1", 10, 0.0)
    assert t2.synced_seq(0.0) == 0
    t2.applied(b"s2", 7, 0.0)
    assert t2.synced_seq(0.0) == 7 and t2.in_sync(0.0) == 2
    assert SyncTracker(required=0, fresh_s=1).synced_seq(0) > 1 << 60


def test_terms_only_grow() -> None:
    g = TermGuard()
    g.check(5)
    g.check(5)
    g.check(9)
    with pytest.raises(StaleTermError):
        g.check(7)
    assert decode_term(json.dumps(term_fields(9, "a", "http://a")).encode()) == 9
    assert decode_term(b'{"after_seq": 5}') == 0  # `mercury promote` by hand: no term
    with pytest.raises(ValueError):
        decode_term(b'{"term": -1}')
