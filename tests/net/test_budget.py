"""The one connection budget and deadline rules (`net/budget.py`), on members standing for
connections: who is evicted at the cap, when a newcomer is refused, what is counted, and
which deadline a connection's state has run out of."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from net.budget import HTTP_LABELS, TCP_LABELS, TLS_LABELS, Budget, Deadlines, Reason


@dataclass(eq=False)
class Conn:
    """A connection as the budget sees it."""

    name: str
    idle_at: float | None = None  # None: a request in progress or bytes to write
    stalled_at: float | None = None
    closed: bool = False
    evicted: bool = False

    def idle_since(self) -> float | None:
        return self.idle_at

    def stalled_since(self) -> float | None:
        return self.stalled_at

    def gone(self) -> bool:
        return self.closed

    def evict(self) -> None:
        self.evicted = True


class Counts:
    def __init__(self) -> None:
        self.seen: list[Reason] = []
        self.sizes: list[int] = []

    def budget(self, cap: int, **kw: object) -> Budget[Conn]:
        return Budget(cap, self.seen.append, on_size=self.sizes.append, **kw)  # type: ignore[arg-type]


def test_under_the_cap_everyone_is_admitted_and_counted() -> None:
    c = Counts()
    b = c.budget(3)
    conns = [Conn(str(i), idle_at=1.0) for i in range(3)]
    assert all(b.admit(x) for x in conns)
    assert len(b) == 3 and c.seen == [] and c.sizes == [1, 2, 3]
    b.leave(conns[1])
    b.leave(conns[1])  # once, whichever of close and loss comes first
    assert c.sizes == [1, 2, 3, 2] and conns[1] not in b


def test_at_the_cap_the_longest_idle_goes_never_a_busy_one() -> None:
    c = Counts()
    b = c.budget(3)
    busy = Conn("busy", idle_at=None)  # a request in progress, or bytes left to write
    old = Conn("old", idle_at=5.0)
    oldest = Conn("oldest", idle_at=2.0)
    for x in (busy, old, oldest):
        assert b.admit(x)
    new = Conn("new", idle_at=9.0)
    assert b.admit(new)
    assert oldest.evicted and not old.evicted and not busy.evicted
    assert oldest not in b and new in b and len(b) == 3
    assert c.seen == [Reason.EVICTED]


def test_a_tie_evicts_the_one_admitted_first() -> None:
    b = Counts().budget(2)
    first, second = Conn("a", idle_at=1.0), Conn("b", idle_at=1.0)
    b.admit(first)
    b.admit(second)
    b.admit(Conn("c", idle_at=1.0))
    assert first.evicted and not second.evicted


def test_at_the_cap_with_every_member_busy_the_newcomer_is_refused() -> None:
    c = Counts()
    b = c.budget(2)
    held = [Conn("a"), Conn("b", stalled_at=0.0)]  # busy; a stalled body, but no rule for it
    for x in held:
        b.admit(x)
    new = Conn("new", idle_at=0.0)
    assert not b.admit(new)
    assert new not in b and len(b) == 2 and not any(x.evicted for x in held)
    assert c.seen == [Reason.REFUSED]


def test_members_already_gone_make_room_before_anyone_is_evicted() -> None:
    """A client that hung up and reconnects at the cap: the one it closed no longer counts,
    and no idle member is evicted for it."""
    c = Counts()
    b = c.budget(2)
    closed, idle = Conn("closed", closed=True), Conn("idle", idle_at=0.0)
    b.admit(closed)
    b.admit(idle)
    assert b.admit(Conn("new"))
    assert closed not in b and not idle.evicted and c.seen == []


def test_the_longest_without_progress_goes_a_partial_request_only_past_the_bound() -> None:
    """Idle or with a request trickling in, the member that has held its slot longest
    without an answer goes first (a body dribbled a byte at a time is no progress); a
    partial request only once it is `stalled_body` old."""
    now = [100.0]
    c = Counts()
    b = c.budget(3, stalled_body=5.0, clock=lambda: now[0])
    fresh = Conn("fresh", stalled_at=97.0)  # 3 s without progress: under the bound
    stale = Conn("stale", stalled_at=90.0)
    staler = Conn("staler", stalled_at=80.0)
    for x in (fresh, stale, staler):
        b.admit(x)
    idle = Conn("idle", idle_at=99.0)
    assert b.admit(idle)
    assert staler.evicted and not stale.evicted and not fresh.evicted
    assert b.admit(Conn("new"))  # the stale body has waited longer than the idle one
    assert stale.evicted and not idle.evicted
    assert b.admit(Conn("newer"))
    assert idle.evicted and not fresh.evicted
    assert c.seen == [Reason.EVICTED] * 3


def test_without_the_stalled_body_rule_a_stalled_body_is_never_evicted() -> None:
    b = Counts().budget(1)
    stalled = Conn("stalled", stalled_at=-1e9)
    b.admit(stalled)
    assert not b.admit(Conn("new"))
    assert not stalled.evicted


def test_a_fifo_budget_evicts_the_oldest_admitted_and_never_refuses() -> None:
    c = Counts()
    b = c.budget(2, fifo=True)
    a, bb = Conn("a", idle_at=0.0), Conn("b", idle_at=0.0)
    b.admit(a)
    b.admit(bb)
    cc = Conn("c", idle_at=0.0)
    assert b.admit(cc)
    assert a.evicted and list(b.members) == [bb, cc]
    assert c.seen == [Reason.EVICTED]


def test_a_fifo_budget_evicts_the_oldest_without_progress_before_any_that_progressed() -> None:
    """A handshake whose ClientHello was answered (`idle_since` None) is older than the
    trickled ones reconnecting behind it: they go first, and it only when none is left."""
    c = Counts()
    b = c.budget(3, fifo=True)
    honest = Conn("honest", idle_at=None)
    t1, t2 = Conn("t1", idle_at=0.0), Conn("t2", idle_at=0.0)
    for m in (honest, t1, t2):
        b.admit(m)
    assert b.admit(Conn("t3", idle_at=0.0))
    assert t1.evicted and not honest.evicted
    b2 = c.budget(2, fifo=True)
    p1, p2 = Conn("p1", idle_at=None), Conn("p2", idle_at=None)
    b2.admit(p1)
    b2.admit(p2)
    assert b2.admit(Conn("n", idle_at=0.0))
    assert p1.evicted  # none without progress: the oldest


@pytest.mark.parametrize(
    ("labels", "reason", "label"),
    [
        (HTTP_LABELS, Reason.REFUSED, "refused"),
        (HTTP_LABELS, Reason.HEAD, "idle"),
        (HTTP_LABELS, Reason.WRITE, "write_timeout"),
        (TCP_LABELS, Reason.REFUSED, "max_connections"),
        (TCP_LABELS, Reason.HEAD, "header_timeout"),
        (TCP_LABELS, Reason.BODY, "body_timeout"),
        (TCP_LABELS, Reason.IDLE, "idle_timeout"),
        (TLS_LABELS, Reason.EVICTED, "evicted"),
        (TLS_LABELS, Reason.HEAD, "timeout"),
    ],
)
def test_each_listener_keeps_its_metric_labels(
    labels: dict[Reason, str], reason: Reason, label: str
) -> None:
    assert labels[reason] == label


D = Deadlines(head=10.0, body=60.0, idle=300.0, write=30.0)


def test_a_stalled_write_counts_whatever_else_the_connection_does() -> None:
    assert D.overdue(131.0, write_paused_at=100.0, working=True) is Reason.WRITE
    assert D.overdue(129.0, write_paused_at=100.0, idle_since=0.0) is None


def test_nothing_runs_out_while_a_request_is_worked_on() -> None:
    assert D.overdue(1e6, working=True, head_since=0.0, idle_since=0.0) is None


@pytest.mark.parametrize(
    ("state", "late", "reason"),
    [
        ({"head_since": 0.0}, 10.5, Reason.HEAD),
        ({"body_since": 0.0}, 60.5, Reason.BODY),
        ({"idle_since": 0.0}, 300.5, Reason.IDLE),
    ],
)
def test_each_clock_runs_out_at_its_own_deadline(
    state: dict[str, Any], late: float, reason: Reason
) -> None:
    assert D.overdue(late - 1.0, **state) is None
    assert D.overdue(late, **state) is reason


def test_a_missing_deadline_never_runs_out() -> None:
    d = Deadlines(head=1.0)
    assert d.overdue(1e12, body_since=0.0) is None
    assert d.overdue(1e12, idle_since=0.0) is None
    assert d.due(Reason.WRITE, 0.0) == float("inf")
