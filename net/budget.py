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
  idle from its accept (`fifo`: the oldest goes);
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

Built for what comes next (the hostile-client work builds on this seam, nothing here acts
on it yet):

- streamed answers (a watch): a stream is a member whose `idle_since` is None (an answer in
  progress), so it is never evicted today. To make a stream whose client takes nothing
  evictable, its connection reports, as `stalled_since`, when its client last took a byte
  (the write clock's start), and the listener sets `stalled_body` (or a stream-specific
  bound) — the budget's eviction order then puts it after the idle ones, before refusing.
  A cap on streams alone is a second `Budget` the watch endpoint admits each stream to
  (`fifo` or not), evicting only among streams.
- slow request bodies: `stalled_since` is the hook. The HTTP listeners report it already
  (a body that received nothing for `stalled_body`); the KT/memcached connections report
  None and their listener sets no `stalled_body`, so their partial bodies stay bounded by
  the body clock and the buffered-bytes cap alone. Turning it on there is reporting the
  last byte's time and setting `stalled_body` in `ListenerLimits.deadlines`.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
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
}
#: `mercury_tls_handshake_failed_total{reason}` (its other reasons are TLS errors).
TLS_LABELS: dict[Reason, str] = {Reason.EVICTED: "evicted", Reason.HEAD: "timeout"}


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
    """A connection (or handshake) as its listener's budget sees it."""

    def idle_since(self) -> float | None:
        """Since when it waits for its next request with nothing left to write; None
        while it has a request in progress or bytes to write (never evicted as idle)."""
        ...

    def stalled_since(self) -> float | None:
        """Since when its request body has received nothing (None: no body pending)."""
        ...

    def gone(self) -> bool:
        """Already closing with nothing left to write (only its loss is still to come)."""
        ...

    def evict(self) -> None:
        """Close it to make room (it has left the budget already)."""
        ...


M = TypeVar("M", bound=Member)


class Budget(Generic[M]):
    """Connections of one listener, at most `cap` (module docstring).

    `count(reason)`: counts a refusal or an eviction in the listener's metric. `on_size(n)`:
    told the member count after every change (the listener's gauge). `stalled_body`:
    evict a member whose body made no progress for this long when none is idle (None:
    never). `fifo`: every member is idle from its admission and its clock never restarts
    (handshakes): the oldest admitted is the victim, found without a scan."""

    def __init__(
        self,
        cap: int,
        count: Callable[[Reason], None],
        *,
        on_size: Callable[[int], None] | None = None,
        stalled_body: float | None = None,
        fifo: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.cap = cap
        self.count = count
        self.on_size = on_size
        self.stalled_body = stalled_body
        self.fifo = fifo
        self.clock = clock or time.monotonic
        #: Members, in admission order (a dict keeps it).
        self.members: dict[M, None] = {}

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, m: object) -> bool:
        return m in self.members

    def admit(self, newcomer: M) -> bool:
        """Count `newcomer` in, evicting a member at the cap; False (counted as refused):
        every member is busy, the newcomer is not admitted."""
        if len(self.members) >= self.cap and not self.fifo:
            self.prune()
        if len(self.members) >= self.cap:
            victim = self.victim()
            if victim is None:
                self.count(Reason.REFUSED)
                return False
            self.count(Reason.EVICTED)
            self.leave(victim)
            victim.evict()
        self.members[newcomer] = None
        self._sized()
        return True

    def leave(self, m: M) -> None:
        """`m` no longer counts (closed, or lost); once, whichever comes first."""
        if m in self.members:
            del self.members[m]
            self._sized()

    def prune(self) -> None:
        """Members already gone (`Member.gone`) no longer count."""
        for m in [m for m in self.members if m.gone()]:
            self.leave(m)

    def victim(self) -> M | None:
        """The member to evict for a newcomer, or None (module docstring)."""
        if self.fifo:
            return next(iter(self.members), None)
        best: M | None = None
        best_at = math.inf
        stalled: M | None = None
        stalled_at = math.inf
        cutoff = -math.inf if self.stalled_body is None else self.clock() - self.stalled_body
        for m in self.members:  # admission order: the older wins a tie
            at = m.idle_since()
            if at is not None:
                if at < best_at:
                    best, best_at = m, at
            elif self.stalled_body is not None and best is None:
                s = m.stalled_since()
                if s is not None and s < cutoff and s < stalled_at:
                    stalled, stalled_at = m, s
        return best if best is not None else stalled

    def _sized(self) -> None:
        if self.on_size is not None:
            self.on_size(len(self.members))
