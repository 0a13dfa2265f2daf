"""Properties of the budget's pure rules (`net/budget.py`) under hypothesis: random
sequences of admissions, tags, state changes and departures over principals, and random
bodies against the minimum-rate rule. What the hostile-client bounds rest on: at a full
budget a principal over its share or unauthenticated goes first, a member with a request
being worked on never goes, a refusal means nobody could go, and a body is cut exactly
when it falls below its rate or passes its deadline, never before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from net.budget import BodyRate, Budget, Principal, Reason, share_cap

NOW = 1000.0
STALLED = 5.0


@dataclass(eq=False)
class Conn:
    idle_at: float | None = None
    stalled_at: float | None = None
    evicted: bool = False

    def idle_since(self) -> float | None:
        return self.idle_at

    def stalled_since(self) -> float | None:
        return self.stalled_at

    def gone(self) -> bool:
        return False

    def evict(self) -> None:
        self.evicted = True


PRINCIPALS = [
    Principal("peer:10.0.0.1"),
    Principal("peer:10.0.0.2"),
    Principal("token:a", True),
    Principal("token:b", True),
]

#: A member's state: busy, idle since t, or a partial request since t.
states = st.one_of(
    st.just((None, None)),
    st.tuples(st.floats(0, NOW), st.none()),
    st.tuples(st.none(), st.floats(0, NOW)),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.sampled_from(PRINCIPALS), states),
        st.tuples(st.just("tag"), st.integers(0, 50), st.sampled_from(PRINCIPALS)),
        st.tuples(st.just("leave"), st.integers(0, 50)),
        st.tuples(st.just("state"), st.integers(0, 50), states),
    ),
    max_size=60,
)


def evictable(b: Budget[Conn], m: Conn) -> bool:
    if m.idle_at is not None:
        return True
    return m.stalled_at is not None and m.stalled_at <= NOW - STALLED


def key(b: Budget[Conn], m: Conn, principals: dict[Conn, Principal]) -> tuple[bool, float]:
    at = m.idle_at if m.idle_at is not None else m.stalled_at
    assert at is not None
    return (principals[m].authenticated, at)


@settings(max_examples=300, deadline=None)
@given(cap=st.integers(1, 8), share=st.sampled_from([0.25, 0.5, 1.0]), script=ops)
def test_a_full_budget_evicts_by_the_rules(
    cap: int, share: float, script: list[tuple[Any, ...]]
) -> None:
    seen: list[Reason] = []
    b: Budget[Conn] = Budget(cap, seen.append, stalled_body=STALLED, clock=lambda: NOW, share=share)
    every: list[Conn] = []
    for op in script:
        live = list(b.members)
        if op[0] == "admit":
            _, p, (idle, stalled) = op
            before = {m: b.members[m] for m in live}
            full = len(b) >= cap
            at_share = b.share_cap < cap and b.holds(p) >= b.share_cap
            over = {q for q, ms in b.held.items() if len(ms) > b.share_cap}
            new = Conn(idle, stalled)
            every.append(new)
            admitted = b.admit(new, p)
            gone = [m for m in before if m.evicted]
            assert len(gone) <= 1 and len(b) <= cap
            if not full:
                assert admitted and not gone
                continue
            if not admitted:
                # Refused: nobody it may take the place of could go.
                pool = [m for m in before if not at_share or before[m] == p]
                assert not any(evictable(b, m) for m in pool)
                assert seen[-1] in (Reason.REFUSED, Reason.SHARE_REFUSED)
                continue
            (victim,) = gone
            assert evictable(b, victim)
            vp = before[victim]
            if at_share:
                assert vp == p  # at its share: only its own principal's slot
                pool = [m for m in before if before[m] == p]
            elif vp in over:
                pool = [m for m in before if before[m] in over]
            else:  # those over their share go first: none of them could
                assert not any(evictable(b, m) for m in before if before[m] in over)
                pool = list(before)
            # Unauthenticated first, then the longest without progress.
            assert all(key(b, m, before) >= key(b, victim, before) for m in pool if evictable(b, m))
        elif not live:
            continue
        elif op[0] == "tag":
            b.tag(live[op[1] % len(live)], op[2])
            assert b.members[live[op[1] % len(live)]] == op[2]
        elif op[0] == "leave":
            b.leave(live[op[1] % len(live)])
        else:
            m = live[op[1] % len(live)]
            m.idle_at, m.stalled_at = op[2]
        # The principals' counts are always the members'.
        assert sum(len(ms) for ms in b.held.values()) == len(b)
        assert all(b.members[m] == p for p, ms in b.held.items() for m in ms)
    assert all(not m.evicted or m not in b for m in every)


def test_a_busy_member_is_never_evicted_even_over_its_share() -> None:
    seen: list[Reason] = []
    b: Budget[Conn] = Budget(4, seen.append, stalled_body=STALLED, share=0.25)
    a = Principal("token:a", True)
    busy = [Conn() for _ in range(4)]
    for m in busy:
        assert b.admit(m, a)
    assert not b.admit(Conn(idle_at=0.0), Principal("peer:x"))
    assert not any(m.evicted for m in busy) and seen == [Reason.REFUSED]


def test_at_its_share_a_principal_only_displaces_its_own() -> None:
    seen: list[Reason] = []
    b: Budget[Conn] = Budget(4, seen.append, share=0.5)
    a, other = Principal("token:a", True), Principal("peer:x")
    mine = [Conn(idle_at=5.0), Conn(idle_at=6.0)]
    theirs = [Conn(idle_at=1.0), Conn(idle_at=2.0)]  # idle longer, but not a's
    for m in theirs:
        b.admit(m, other)
    for m in mine:
        b.admit(m, a)
    assert b.admit(Conn(idle_at=9.0), a)
    assert mine[0].evicted and not any(m.evicted for m in theirs)
    assert seen == [Reason.EVICTED]
    # With none of its own to displace it is refused, though others could go.
    for m in b.held[a]:
        m.idle_at = None
    assert not b.admit(Conn(idle_at=9.0), a)
    assert seen[-1] is Reason.SHARE_REFUSED


def test_a_principal_over_its_share_is_displaced_first() -> None:
    seen: list[Reason] = []
    b: Budget[Conn] = Budget(4, seen.append, share=0.5)
    a, other = Principal("token:a", True), Principal("token:b", True)
    early = Conn(idle_at=1.0)
    b.admit(early, other)
    hog = [Conn(idle_at=5.0 + i) for i in range(3)]
    for m in hog:
        b.admit(m, a)
    assert b.admit(Conn(idle_at=9.0), other)
    assert hog[0].evicted and not early.evicted
    assert seen == [Reason.SHARE]


def test_unauthenticated_before_authenticated_whatever_their_age() -> None:
    b: Budget[Conn] = Budget(2, lambda r: None)
    old = Conn(idle_at=1.0)
    anon = Conn(idle_at=50.0)
    b.admit(old, Principal("token:a", True))
    b.admit(anon, Principal("peer:x"))
    assert b.admit(Conn(idle_at=60.0), Principal("peer:y"))
    assert anon.evicted and not old.evicted


def test_share_cap_is_at_least_one_and_at_most_the_cap() -> None:
    assert share_cap(1000, 0.25) == 250
    assert share_cap(3, 0.25) == 1
    assert share_cap(10, 1.0) == 10 and share_cap(10, 2.0) == 10


rates = st.builds(
    BodyRate,
    min_rate=st.sampled_from([0.0, 1.0, 1024.0, 65536.0]),
    grace=st.floats(0, 10),
    total=st.one_of(st.none(), st.floats(1, 120)),
)


@settings(max_examples=500, deadline=None)
@given(rule=rates, rate=st.floats(0, 1e6), elapsed=st.floats(0, 200))
def test_a_body_at_or_above_the_rate_is_cut_only_by_its_deadline(
    rule: BodyRate, rate: float, elapsed: float
) -> None:
    received = int(rate * elapsed) + 1
    verdict = rule.check(elapsed, 0.0, received)
    if rule.total is not None and elapsed > rule.total:
        assert verdict is Reason.BODY
    elif rate >= rule.min_rate:
        assert verdict is None
    elif elapsed >= rule.grace and received < rule.min_rate * elapsed:
        assert verdict is Reason.SLOW_BODY


@settings(max_examples=500, deadline=None)
@given(rule=rates, received=st.integers(0, 1 << 24), start=st.floats(0, 100))
def test_the_next_check_is_when_a_body_that_stops_is_first_cut(
    rule: BodyRate, received: int, start: float
) -> None:
    now = NOW + start
    if rule.check(now, NOW, received) is not None:
        return
    due = rule.next_check(now, NOW, received)
    assert due > now
    if due == float("inf"):
        assert rule.total is None and rule.min_rate == 0
        return
    # Not cut before it (by more than the timer's millisecond), cut at it.
    assert rule.check(max(now, due - 2e-3), NOW, received) is None or due - now <= 2e-3
    assert rule.check(due, NOW, received) is not None
