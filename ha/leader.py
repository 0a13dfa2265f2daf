"""The elected root's HA wiring: lease fencing, semi-synchronous acknowledgement, term.

The candidate (`ha/candidate.py`) keeps a warm `mercury root ... --ha-await-go`
process ready (its imports done) that waits in `wait_for_go` for one line on stdin,
"TERM DEADLINE", once the candidate won term TERM; from then on the candidate writes one
line per successful lease renewal: the monotonic deadline (`ha.lease.LeaseClock`, margin
applied; CLOCK_MONOTONIC is system-wide) until which acknowledging is safe. This module,
installed by `mercury/root.py` on the gateway app:

- gates every committed batch (`Batcher.set_ack_gate`): the batch's writers are answered only
  once `--sync-standbys` standbys reported (upstream `APPLIED` frames on the replication
  link) a seq at least the batch's, within `--sync-timeout-ms` (else 503 `not-in-sync`),
  and only while the lease deadline has not passed (else 503 `not-leader`);
- exits the process at once when the deadline passes or stdin closes (the candidate is
  gone or has deposed this leader): nothing is acknowledged past it;
- records the promotion with its term in the log (`store.promotion.promote`: replicated
  document ``promotion``) before serving, and refuses to lead a store that already holds
  a newer term;
- answers `GET /v1/status` with ``role: leader``, the term and this node's URL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse, Response

from core.service import Service
from ha import metrics as ha_metrics
from ha.errors import NotInSyncError
from ha.gate import ack_verdict
from ha.lease import LeaseClock
from ha.syncack import SyncTracker
from net import certs
from replicator import upstream
from replicator.source import ReplicationSource
from replicator.terms import store_term
from store import setaside
from store.promotion import promote
from store.store import Store
from store.terms import StaleTermError, TermGuard, term_fields

log = logging.getLogger("mercury.ha.leader")

#: Certificate roles whose link may report as a standby: a candidate's (``root``); a link
#: without TLS (None: nothing to tell) and one let in without a role by
#: --tls-allow-roleless ("none") as before roles.
STANDBY_ROLES = frozenset({certs.ROOT, "none", None})


class LeaderGate:
    """Decides when a committed batch may be acknowledged (runs on the gateway's loop)."""

    def __init__(self, required: int, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        # A standby silent for the sync timeout is out of sync.
        self.tracker = SyncTracker(required, fresh_s=max(timeout_s, 1.0))
        self.clock = LeaseClock(margin_s=0.0)  # deadlines arrive with the margin applied
        self._changed = asyncio.Event()
        self.not_in_sync = 0
        #: APPLIED reports dropped: their link's certificate is not a standby's.
        self.foreign_reports = 0
        #: called after each report (the replication sources: their horizon moved)
        self.on_applied: list[Callable[[], None]] = []

    def applied(self, origin: upstream.Origin, _kind: int, payload: bytes) -> None:
        """Upstream handler of `upstream.APPLIED`. Over TLS only a candidate's (``root``)
        certificate speaks for a standby: a replica's report would let the leader
        acknowledge writes no standby holds, so it is dropped and logged."""
        if origin.role not in STANDBY_ROLES:
            self.foreign_reports += 1
            if self.foreign_reports == 1 or self.foreign_reports % 1000 == 0:
                log.warning(
                    "ignored APPLIED reports from %s (%d so far): its certificate has role "
                    "%s; a standby needs a root certificate",
                    origin.peer,
                    self.foreign_reports,
                    origin.role,
                )
            return
        self.tracker.applied(origin.client_id, upstream.decode_applied(payload), time.monotonic())
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()
        for cb in self.on_applied:
            cb()

    def listen(self, wake: Callable[[], None]) -> None:
        """`Batcher.set_ack_gate`: `wake` runs after each report, first (it answers the
        writers the report confirmed)."""
        self.on_applied.insert(0, wake)

    def verdict(self, seq: int, waited_s: float) -> bool | Exception:
        """`gate.ack_verdict` now (`gateway.batcher.AckGate`)."""
        v = ack_verdict(self.tracker, self.clock, seq, waited_s, self.timeout_s, time.monotonic())
        if isinstance(v, NotInSyncError):
            self.not_in_sync += 1
        return v

    async def confirmed(self, seq: int, timeout_s: float) -> bool:
        """Wait until `seq` is confirmed by the required standbys, at most `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.tracker.synced_seq(time.monotonic()) < seq:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ev = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await ev.wait()
        return True


class HandOver:
    """On a clean stop, holds the replication sources open until the standbys confirmed
    everything this leader committed, its last batch and the documents written at stop
    included (usage series, read ledger). Without it every rolling restart of a leader left
    it a tail nobody else held, which the next leader's history probe then moved aside
    (a re-bootstrap of the whole store). Bounded by the sync timeout: a leader with no
    standby in sync still stops."""

    name = "ha-hand-over"

    def __init__(self, store: Store, gate: LeaderGate) -> None:
        self.store = store
        self.gate = gate

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        seq = self.store.last_seq()
        if await self.gate.confirmed(seq, max(self.gate.timeout_s, 1.0)):
            log.info("handed over: standbys confirmed seq %d", seq)
        else:
            log.warning(
                "stopping with seq %d not confirmed by %d standby(s): this node may have "
                "to move its tail aside when it rejoins",
                seq,
                self.gate.tracker.required,
            )


class LeaderService:
    """Reads lease deadlines from stdin, fences on expiry, records the term."""

    name = "ha-leader"

    def __init__(
        self, app: FastAPI, store: Store, gate: LeaderGate, term: int, node: str, url: str
    ) -> None:
        self.app = app
        self.store = store
        self.gate = gate
        self.term = term
        self.node = node
        self.url = url
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        gw = self.app.state.gw
        gw.batcher.set_ack_gate(self.gate)
        fd = sys.stdin.fileno()
        os.set_blocking(fd, False)
        buf = bytearray()

        def on_stdin() -> None:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                return
            if not data:
                _fence("the candidate closed the lease channel")
            buf.extend(data)
            *lines, rest = bytes(buf).split(b"\n")
            buf[:] = rest
            for line in lines:
                if line.strip():
                    self.gate.clock.deadline = max(self.gate.clock.deadline, float(line))

        loop.add_reader(fd, on_stdin)
        # Fenced at the deadline even with nothing arriving on stdin.
        self._watch = loop.create_task(self._watchdog())
        try:
            TermGuard(store_term(self.store)).check(self.term, "leadership")
        except StaleTermError as err:
            _fence(str(err))
        # The store continues its history as this leader's: the promotion, with the term,
        # goes into the log before anything is acknowledged (in the commit thread: the
        # batcher's single writer).
        fields = term_fields(self.term, self.node, self.url)
        await loop.run_in_executor(gw.batcher.executor, lambda: promote(self.store, extra=fields))
        log.info("leading term %d at seq %d", self.term, self.store.last_seq())

    async def _watchdog(self) -> None:
        while True:
            left = self.gate.clock.left(time.monotonic())
            if left <= 0:
                _fence("lease deadline passed without renewal")
            await asyncio.sleep(min(0.05, left))

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()


def _fence(why: str) -> None:
    """Stop acknowledging now: exit without answering anything more."""
    log.error("fenced: %s; exiting", why)
    logging.shutdown()
    os._exit(75)


def wait_for_go(args: argparse.Namespace) -> None:
    """Block until the candidate says "TERM DEADLINE" on stdin (it won the election), with
    every import already done: the failover does not wait for Python to start. Exits
    quietly when stdin closes first (the candidate stopped or replaced this process)."""
    line = bytearray()
    while not line.endswith(b"\n"):
        b = os.read(sys.stdin.fileno(), 1)  # unbuffered: later lines are the deadlines
        if not b:
            os._exit(0)
        line += b
    term, deadline = line.split()
    args.ha_term = int(term)
    args.ha_deadline = float(deadline)


def install(app: FastAPI, store: Store, services: list[Service], args: argparse.Namespace) -> None:
    """Wire the leader's HA pieces into the root about to serve (see the module doc)."""
    term = int(args.ha_term)
    url = args.advertise_url
    node = args.ha_node or url
    required = args.sync_standbys if args.sync_standbys is not None else 1
    gate = LeaderGate(required, args.sync_timeout_ms / 1000)
    # The deadline the candidate held when it elected us (refreshed on stdin from then on).
    gate.clock.deadline = float(args.ha_deadline)
    ha_metrics.LEADER.set(1)
    ha_metrics.SYNC_REQUIRED.set(required)
    ha_metrics.STANDBYS_IN_SYNC.set_function(lambda: gate.tracker.in_sync(time.monotonic()))
    sources: Sequence[Service] = [s for s in services if isinstance(s, ReplicationSource)]
    for src in sources:
        assert isinstance(src, ReplicationSource)
        if src.upstream is None:
            src.upstream = upstream.UpstreamRouter()
        src.upstream.register(upstream.APPLIED, gate.applied)
        # Plain replicas get only what standbys confirmed: a failover never undoes a record
        # a replica holds, so replicas follow the next leader without a gap or bootstrap.
        src.horizon = lambda: gate.tracker.synced_seq(time.monotonic())
        gate.on_applied.append(src.wake_held)
    services.append(LeaderService(app, store, gate, term, node, url))
    # Stopped right before the sources (services stop in reverse): after every write of
    # the stop, while the standbys still stream.
    last_source = max(i for i, s in enumerate(services) if isinstance(s, ReplicationSource))
    services.insert(last_source + 1, HandOver(store, gate))

    async def status(request: Request) -> Response:
        seq, head = store.head()
        now = time.monotonic()
        return JSONResponse(
            {
                "db_id": store.db_id,
                "role": "leader",
                "term": term,
                "leader_url": url,
                "node": node,
                "seq": seq,
                "hash_head": head.hex(),
                "sync_standbys": required,
                "standbys_in_sync": gate.tracker.in_sync(now),
                "lease_left_s": round(gate.clock.left(now), 3),
                **setaside.node_facts(store.path, *store.retained()),
            }
        )

    # Ahead of the gateway's own /v1/status: routes match in order.
    app.router.routes.insert(0, APIRoute("/v1/status", status, methods=["GET"]))
