"""One connection budget and one set of deadline rules for every listener of a process.

Three kinds of connection hold a descriptor and memory for as long as a peer keeps them
open: the HTTP listeners' (`net/http_bounds.py`, over uvicorn's protocol), the KT and
memcached listeners' (`net/tcp.py`), and TLS handshakes not yet finished (`net/tlsconn.py`).
Each listener has one `Budget`: its cap, and who goes when a newcomer finds it full (an
HTTPS listener has two: its handshakes, capped at its connection cap, and the connections
whose handshake is done, which then enter the HTTP listener's). The rule is one for all:

- a connection already closing with nothing left to write (its client hung up; only its
  `connection_lost` is still to come) no longer counts, so a client that closes and
  reconnects at the cap is served;
- then the member idle the longest is evicted: one waiting for its next request, never one
  with a request in progress or bytes left to write (closing it would lose its client an
  answer). What "idle" is belongs to the listener (`Member.idle_since`); a TLS handshake is
  idle from its accept until its peer's first message was whole and answered (`fifo`:
  the oldest without that progress goes, else the oldest);
- else, where the listener says a request body that makes no progress may go
  (`Deadlines.stalled_body`), the member whose body has received nothing for longest,
  at least that long (`Member.stalled_since`): nothing it sent was acted on yet;
- else the newcomer is refused (the listener sends its busy answer, if any).

Every refusal, eviction and close by a bound has one `Reason`; each listener keeps its own
metric and label names for them (`HTTP_LABELS`, `TCP_LABELS`, `TLS_LABELS`), which
dashboards and tests read.

`Deadlines` are the four clocks every listener applies, with one precedence (`overdue`):
the write clock (its client has taken nothing of its answer since the transport passed its
high-water mark), then none while a request is being worked on, then the head clock (the
request's head must be complete), the body clock (the whole request) and the idle clock (no
request at all). The HTTP listeners start the head clock when they begin to wait for a head
(opening, or the last answer), so their idle and head deadlines are one (`--http-idle-
timeout`); the KT/memcached listeners start it at a request's first byte.

Principals and shares. Every member holds its slot for a `Principal`: the peer address
(unauthenticated) from its admission, then, once the application has authenticated a request
on it, the token or certificate it proved (`Budget.tag`; authenticated). No principal may
hold more than `share` of a full budget: while there is room anyone is admitted (the
budget is work-conserving), but at the cap a newcomer whose principal already holds its
share may only take the slot of one of its own principal's members, and a newcomer under
its share evicts first from the principals holding more than theirs. Within that, the
order is one: unauthenticated members before authenticated ones, then the member that has
held its slot longest without useful progress (an answer): `idle_since` for one waiting
for its next request, `stalled_since` for one whose request is only partly received (a
body trickling in is no progress: nothing it sent was acted on), evictable once that is
at least `stalled_body` old. A member with a request being worked on, or bytes left to
write, is never evicted.

A second budget (streamed answers, e.g. a watch) uses the same class: its own `Budget`
(cap from its own flag, `share` from the same share flag), admitting each stream with the
principal its request authenticated as (`token_principal`/`cert_principal`, else
`peer_principal` of the connection's peer), `leave` when the stream ends. A stream's
`idle_since` is None (its answer is in progress) and its `stalled_since` is when its
client last took a byte (`reads/watch.py`: when its last line was handed to its socket,
which waits while the client takes nothing), with `stalled_body` 0: every stream may go
(its client resumes where it was), the one stuck longest first and one whose client keeps
up last, so a budget filled by streams nobody reads (on a quiet prefix they are never
paused) still makes room, over-share principals' first.
Being a separate budget, streams never take the request budget's slots: the connection
whose request opened a stream leaves the request budget when its stream starts
(`net.http_bounds.streaming`), and its answer is the last on it (`connection: close`).

Request bodies (`BodyRate`): after a grace a body must keep arriving at an average of at
least `min_rate` bytes a second since its head was read, and be complete within `total`,
or its connection is answered 408 and closed (`Reason.SLOW_BODY`, `Reason.BODY`): holding a
slot for T seconds costs a peer at least `min_rate * T` bytes sent, and never more than
`total`. The KT/memcached listeners apply the same rule to a partial request (head and
body: they start its clock at its first byte).
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


class Reason(enum.Enum):
    """Why a listener refused or closed a connection itself."""

    REFUSED = "refused"  # at the cap, no member could be evicted
    EVICTED = "evicted"  # made room for a newcomer at the cap
    HEAD = "head"  # its request head was not complete in time
    BODY = "body"  # its whole request was not in in time
    IDLE = "idle"  # no request for too long
    WRITE = "write"  # its client took none of its answer for too long
    HEADER_TOO_LARGE = "header_too_large"
    UNSENT_CAP = "unsent_cap"  # over the listener's cap on answer bytes not taken
    BUFFER_CAP = "buffer_cap"  # over the listener's cap on request bytes buffered
    SLOW_BODY = "slow_body"  # its request arrived slower than the minimum rate
    SHARE = "share"  # evicted at the cap for another principal: its own held over its share
    SHARE_REFUSED = "share_refused"  # at the cap and its share (others could have gone)


#: `mercury_http_connections_closed_total{reason}`: the HTTP listeners' head deadline is
#: their idle deadline (`--http-idle-timeout`), counted as "idle".
HTTP_LABELS: dict[Reason, str] = {
    Reason.REFUSED: "refused",
    Reason.EVICTED: "evicted",
    Reason.HEAD: "idle",
    Reason.IDLE: "idle",
    Reason.WRITE: "write_timeout",
    Reason.HEADER_TOO_LARGE: "header_too_large",
    Reason.UNSENT_CAP: "unsent_cap",
    Reason.BODY: "body_timeout",
    Reason.SLOW_BODY: "slow_body",
    Reason.SHARE: "share_evicted",
    Reason.SHARE_REFUSED: "share_refused",
}
#: `mercury_listener_refused_total{listener, reason}` of the KT/memcached listeners.
TCP_LABELS: dict[Reason, str] = {
    Reason.REFUSED: "max_connections",
    Reason.EVICTED: "evicted",
    Reason.HEAD: "header_timeout",
    Reason.BODY: "body_timeout",
    Reason.IDLE: "idle_timeout",
    Reason.WRITE: "write_timeout",
    Reason.UNSENT_CAP: "unsent_cap",
    Reason.BUFFER_CAP: "buffer_cap",
    Reason.SLOW_BODY: "slow_body",
    Reason.SHARE: "share_evicted",
    Reason.SHARE_REFUSED: "share_refused",
}
#: `mercury_tls_handshake_failed_total{reason}` (its other reasons are TLS errors).
TLS_LABELS: dict[Reason, str] = {
    Reason.EVICTED: "evicted",
    Reason.HEAD: "timeout",
    Reason.SHARE: "share_evicted",
}


@dataclass(frozen=True, slots=True)
class Principal:
    """Who holds a slot: `name` is ``peer:<address>`` (unauthenticated), ``token:<digest>``
    or ``cert:<digest>`` (authenticated by the application or the TLS handshake)."""

    name: str
    authenticated: bool = False


#: The principal of members admitted without one (tests, a peer with no address).
ANONYMOUS = Principal("peer:", False)


def peer_principal(peername: object) -> Principal:
    """The unauthenticated principal of a peer: its address (not its port: one host's many
    connections are one principal), from a transport's ``peername`` extra."""
    if isinstance(peername, tuple) and peername:
        return Principal(f"peer:{peername[0]}", False)
    return ANONYMOUS


def _digest(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:24]


def token_principal(token: str) -> Principal:
    """The principal of a bearer token the application has verified (its digest: the
    token itself never leaves the request)."""
    return Principal(f"token:{_digest(token.encode())}", True)


def cert_principal(der: bytes) -> Principal:
    """The principal of a verified client certificate (its DER's digest)."""
    return Principal(f"cert:{_digest(der)}", True)


def share_cap(cap: int, share: float) -> int:
    """Slots one principal may hold of a full budget of `cap`: `share` of it, at least
    one (a share of 1 or more: all of them)."""
    if share >= 1.0:
        return cap
    return max(1, int(cap * share))


@dataclass(frozen=True, slots=True)
class BodyRate:
    """The rule for a request arriving (module docstring): from `since` (its head read; a
    KT/memcached request's first byte) it may take `grace` seconds, then it must average
    at least `min_rate` bytes a second since `since` (0: no rate), and be complete within
    `total` seconds (None: no deadline)."""

    min_rate: float = 0.0
    grace: float = 0.0
    total: float | None = None

    def check(self, now: float, since: float, received: int) -> Reason | None:
        """The bound a request that began at `since` and received `received` bytes so far
        has broken at `now`, or None."""
        elapsed = now - since
        if self.total is not None and elapsed > self.total:
            return Reason.BODY
        if self.min_rate > 0 and elapsed >= self.grace and received < self.min_rate * elapsed:
            return Reason.SLOW_BODY
        return None

    def next_check(self, now: float, since: float, received: int) -> float:
        """When, if nothing more arrives, the request next breaks a bound (inf: never); at
        least a millisecond after `now`, so a timer re-armed at it always moves on."""
        due = math.inf if self.total is None else since + self.total + 1e-3
        if self.min_rate > 0:
            # received < min_rate * (t - since) from t = since + received / min_rate on
            due = min(due, since + max(self.grace, received / self.min_rate) + 1e-3)
        return max(due, now + 1e-3)


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Seconds each clock may run (None: no such deadline). `stalled_body`: a request body
    that received nothing for this long may be evicted at the cap (body progress)."""

    head: float | None = None
    body: float | None = None
    idle: float | None = None
    write: float | None = None
    stalled_body: float | None = None

    def due(self, reason: Reason, since: float) -> float:
        """When the clock of `reason` started at `since` runs out (inf: never)."""
        limit = {
            Reason.HEAD: self.head,
            Reason.BODY: self.body,
            Reason.IDLE: self.idle,
            Reason.WRITE: self.write,
        }[reason]
        return math.inf if limit is None else since + limit

    def overdue(
        self,
        now: float,
        *,
        write_paused_at: float | None = None,
        working: bool = False,
        head_since: float | None = None,
        body_since: float | None = None,
        idle_since: float | None = None,
    ) -> Reason | None:
        """The deadline a connection in this state has run out of at `now`, or None.
        Precedence: a stalled write (whatever else it does), nothing while its request is
        being worked on, then its partial request's head or body, then idleness."""
        if write_paused_at is not None:
            return Reason.WRITE if now > self.due(Reason.WRITE, write_paused_at) else None
        if working:
            return None
        for reason, since in (
            (Reason.HEAD, head_since),
            (Reason.BODY, body_since),
            (Reason.IDLE, idle_since),
        ):
            if since is not None:
                return reason if now > self.due(reason, since) else None
        return None


class Member(Protocol):
    """A connection (or handshake, or stream) as its budget sees it."""

    def idle_since(self) -> float | None:
        """Since when it waits for its next request with nothing left to write; None
        while it has a request in progress or bytes to write (never evicted as idle)."""
        ...

    def stalled_since(self) -> float | None:
        """Since when it has held its slot without useful progress while a request is only
        partly received (its last answer, or its admission); None: no such request (or,
        for a stream, since when its client has taken nothing)."""
        ...

    def gone(self) -> bool:
        """Already closing with nothing left to write (only its loss is still to come)."""
        ...

    def evict(self) -> None:
        """Close it to make room (it has left the budget already)."""
        ...


M = TypeVar("M", bound=Member)


class Budget(Generic[M]):
    """Members of one budget, at most `cap` (module docstring).

    `count(reason)`: counts a refusal or an eviction in the listener's metric. `on_size(n)`:
    told the member count after every change (the listener's gauge). `stalled_body`:
    a member whose partial request made no progress for this long may be evicted (None:
    never). `fifo`: every member is idle from its admission and its clock never restarts
    (handshakes): the oldest admitted still idle (`idle_since` not None) is the victim,
    else the oldest admitted. `share`: the part of a full budget
    one principal may hold (`share_cap`)."""

    def __init__(
        self,
        cap: int,
        count: Callable[[Reason], None],
        *,
        on_size: Callable[[int], None] | None = None,
        stalled_body: float | None = None,
        fifo: bool = False,
        clock: Callable[[], float] | None = None,
        share: float = 1.0,
    ) -> None:
        self.cap = cap
        self.count = count
        self.on_size = on_size
        self.stalled_body = stalled_body
        self.fifo = fifo
        self.clock = clock or time.monotonic
        self.share = share
        self.share_cap = share_cap(cap, share)
        #: Members, in admission order (a dict keeps it), with their principals.
        self.members: dict[M, Principal] = {}
        #: Each principal's members (in the order they came to it).
        self.held: dict[Principal, dict[M, None]] = {}
        #: Each member's admission number (ties, and the order of pools of several
        #: principals).
        self._seq: dict[M, int] = {}
        self._next = itertools.count()

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, m: object) -> bool:
        return m in self.members

    def holds(self, principal: Principal) -> int:
        """Slots `principal` holds now."""
        return len(self.held.get(principal, ()))

    def principal_of(self, m: M) -> Principal | None:
        return self.members.get(m)

    def admit(self, newcomer: M, principal: Principal = ANONYMOUS) -> bool:
        """Count `newcomer` in for `principal`, evicting a member at the cap; False
        (counted as refused): no member may be evicted for it, it is not admitted."""
        if len(self.members) >= self.cap and not self._make_room(principal):
            return False
        self._add(newcomer, principal)
        self._sized()
        return True

    def _make_room(self, principal: Principal) -> bool:
        """At the cap: a slot for a newcomer of `principal` (module docstring), or False
        (counted). The scans drop the members already gone they meet (`victim`): when
        that makes room, nobody is evicted."""
        reason = Reason.EVICTED
        if self.share_cap < self.cap and self.holds(principal) >= self.share_cap:
            # At its share: it may only take the slot of one of its own.
            victim = self.victim([principal])
            if self._room():
                return True
            if victim is None:
                # "share_refused" only when the share made the difference.
                other = self.victim(self.held)
                if self._room():
                    return True
                self.count(Reason.REFUSED if other is None else Reason.SHARE_REFUSED)
                return False
        else:
            victim = self.victim(self._over_share())
            if self._room():
                return True
            if victim is not None and self.members[victim] != principal:
                reason = Reason.SHARE  # displaced: its principal held over its share
            elif victim is None:
                victim = self.victim(self.held)
                if self._room():
                    return True
        if victim is None:
            self.count(Reason.REFUSED)
            return False
        self.count(reason)
        self.leave(victim)
        victim.evict()
        return True

    def _room(self) -> bool:
        return len(self.members) < self.cap

    def tag(self, m: M, principal: Principal) -> None:
        """`m` now holds its slot for `principal` (its request authenticated as that).
        Never evicts: the share counts at the cap (`admit`)."""
        old = self.members.get(m)
        if old is None or old == principal:
            return
        ms = self.held[old]
        del ms[m]
        if not ms:
            del self.held[old]
        self.members[m] = principal  # keeps its place in the admission order
        self.held.setdefault(principal, {})[m] = None

    def leave(self, m: M) -> None:
        """`m` no longer counts (closed, or lost); once, whichever comes first."""
        p = self.members.get(m)
        if p is not None:
            self._drop(m, p)
            self._sized()

    def prune(self) -> None:
        """Members already gone (`Member.gone`) no longer count."""
        for m in [m for m in self.members if m.gone()]:
            self.leave(m)

    def victim(self, principals: Iterable[Principal]) -> M | None:
        """The member of `principals`' to evict, or None (module docstring):
        unauthenticated before authenticated, then the longest without progress; the
        older admitted wins a tie. Members already gone (`Member.gone`) it meets leave the
        budget. (Scanned a principal at a time: its members share its authentication, and
        once an unauthenticated one is found no authenticated principal's members need
        looking at; one pass, not a separate one for the gone, as at the cap under a flood
        this runs for every newcomer.)"""
        if self.fifo and principals is self.held:
            return self._fifo_victim([self.members])
        pools = [p for p in principals if p in self.held]
        if self.fifo:
            return self._fifo_victim([self.held[p] for p in pools])
        pools.sort(key=lambda p: p.authenticated)
        best: M | None = None
        best_at = math.inf
        best_auth = True
        cutoff = -math.inf if self.stalled_body is None else self.clock() - self.stalled_body
        stalled = self.stalled_body is not None
        gone: list[M] = []
        for p in pools:
            auth = p.authenticated
            if best is not None and auth and not best_auth:
                break  # an unauthenticated one goes before any of these
            for m in self.held[p]:
                if m.gone():
                    gone.append(m)  # already closing: it no longer counts
                    continue
                at = m.idle_since()
                if at is None:
                    if not stalled:
                        continue
                    at = m.stalled_since()
                    if at is None or at > cutoff:
                        continue
                if best is None or (auth, at) < (best_auth, best_at):
                    best, best_at, best_auth = m, at, auth
                elif (auth, at) == (best_auth, best_at) and self._seq[m] < self._seq[best]:
                    best = m
        for m in gone:
            self.leave(m)
        return best

    def _fifo_victim(self, pools: list[dict[M, Principal] | dict[M, None]]) -> M | None:
        """The victim of a fifo budget among `pools` (each in admission order): the oldest
        admitted that made no progress yet (`idle_since` not None), else the oldest. A
        handshake whose peer sent its whole first message and was answered has progressed:
        an attacker reconnecting at the cap as fast as it is cut must not evict an honest
        peer's handshake for being a few milliseconds older than its own (it scans past
        the progressed ones only, which an attacker can hold only by completing its first
        message, paid for with the node's answer to it)."""
        fresh: M | None = None
        oldest: M | None = None
        for ms in pools:
            for m in ms:
                if oldest is None or self._seq[m] < self._seq[oldest]:
                    oldest = m
                if m.idle_since() is not None:
                    if fresh is None or self._seq[m] < self._seq[fresh]:
                        fresh = m
                    break  # the pool's oldest without progress
        return fresh if fresh is not None else oldest

    def _over_share(self) -> list[Principal]:
        """The principals holding more than their share."""
        if self.share_cap >= self.cap:
            return []
        return [p for p, ms in self.held.items() if len(ms) > self.share_cap]

    def _order(self, m: M) -> int:
        return self._seq[m]

    def _add(self, m: M, p: Principal) -> None:
        self.members[m] = p
        self.held.setdefault(p, {})[m] = None
        self._seq[m] = next(self._next)

    def _drop(self, m: M, p: Principal) -> None:
        del self.members[m]
        del self._seq[m]
        ms = self.held[p]
        del ms[m]
        if not ms:
            del self.held[p]

    def _sized(self) -> None:
        if self.on_size is not None:
            self.on_size(len(self.members))
