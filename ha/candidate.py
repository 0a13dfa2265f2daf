"""`mercury root DATA_DIR --ha-etcd URL ...`: a root candidate (docs/ha.md).

One process per candidate node, on one asyncio loop:

- **lease**: an etcd lease of `--lease-ttl-s`, renewed every `ha.lease.renew_interval`;
  each success moves the acknowledgement deadline (`ha.lease.LeaseClock`) and is passed to
  the leading root process on its stdin;
- **election**: the key ``/mercury/<group>/leader``, created if absent and bound to our
  lease (`ha.etcd.Etcd.create`), polled every `POLL_S`; its create revision is the term;
- **leader**: the root process itself (`mercury root ... --ha-term T`, the same command
  line), started once we win; it binds the gateway and replication addresses, and
  `ha/leader.py` fences, gates acknowledgements and records the term. It dies with
  this process (PR_SET_PDEATHSIG and its stdin's EOF) and is SIGKILLed at once when we lose
  the key or the lease deadline passes;
- **standby**: otherwise `ha/standby.Standby` replicates from the leader and
  reports its applied seq upstream, while `ha/front.Front` answers on the gateway
  address (status; 307 to the leader, or with `--ha-forward` the leader's own answer to
  a write passed on; 503 + Retry-After during an election, and whenever the leader cannot
  be confirmed: its lease not renewing on etcd, or our link to it broken — `ha.role.may_route`);
- **hand-over** (`kill -USR2`): a standby's new executable takes the front's socket and
  reports READY once it has read the election key; this process then revokes its lease,
  closes its store, drains its front and exits 0; the new one opens the store and follows
  the leader (`_hand_over`, `_take_over`). A leader first steps down (`_step_down`: its
  root stops cleanly, the key is deleted, a standby wins at once), then hands over as a
  standby (docs/ha.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time

from core import eventloop, lifeline
from core.addr import parse_hostport
from core.errors import MercuryError
from ha.etcd import Etcd, EtcdError
from ha.front import Forwarder, Front
from ha.lease import LeaseClock, margin_for, renew_interval, renewing
from ha.metrics import standby_metrics
from ha.role import (
    LeaderInfo,
    Progress,
    Role,
    View,
    decide,
    decode_progress,
    election_key,
    encode_progress,
    may_campaign,
    may_route,
    progress_prefix,
)
from ha.standby import Standby
from net import handover
from net.tlsconf import TlsContexts, TlsFiles, client_context, server_context
from replicator.terms import store_term
from store import layout, setaside
from store.lock import StoreLockedError, WriterLock
from store.store import Store

log = logging.getLogger("mercury.ha.candidate")

#: How often the election key is read.
POLL_S = 0.2
#: After our root process died while leading, leave the next term to the others this long.
COOLDOWN_S = 3.0
#: How long a candidate turning leader lets its front's answers in flight finish (they are
#: election 503s or forwards to a dead leader) before its root takes the socket's queue.
LEAD_DRAIN_S = 1.0


class Candidate:
    """One root candidate (see the module doc)."""

    def __init__(self, args: argparse.Namespace, files: TlsFiles | None) -> None:
        self.args = args
        self.data_dir: str = args.data_dir
        self.listen = parse_hostport(args.listen, "--listen")
        scheme = "https" if args.tls_cert else "http"
        self.url: str = args.advertise_url or f"{scheme}://{args.listen}"
        self.repl: str = args.advertise_repl or args.repl_listen
        self.node: str = args.ha_node or self.url
        self.ttl: int = args.lease_ttl_s
        self.etcd = Etcd([u for u in args.ha_etcd.split(",") if u])
        self.key = election_key(args.ha_group)
        self.clock = LeaseClock(margin_s=margin_for(self.ttl))
        self.lease: int | None = None
        self.view = View(Role.ELECTING, None)
        self.child: asyncio.subprocess.Process | None = None
        #: a root process with its imports done, waiting to be told it leads
        self._warm_child: asyncio.subprocess.Process | None = None
        self.child_term: int | None = None
        self.standby: Standby | None = None
        #: mutual TLS to the leader's replication source, HTTPS on the front (None: off)
        self.tls = TlsContexts(files) if files is not None else None
        front_ssl = server_context(files, require_client_cert=False) if files else None
        metrics = standby_metrics(self.data_dir, self._standby_store)
        forward = (
            Forwarder(self.node, client_context(files) if files else None)
            if getattr(args, "ha_forward", False)
            else None
        )
        #: Started by a hand-over (`kill -USR2` on the old candidate): the front takes the
        #: old one's listening socket, and no standby starts (nor is a campaign run) until
        #: the old process has released the store (`_take_over`).
        self.inheriting = handover.handed_over()
        self.front = Front(
            *self.listen,
            self._status,
            front_ssl,
            metrics,
            forward,
            sock=handover.SOCKETS.take(handover.HTTP),
        )
        #: a hand-over of ours under way (no campaign meanwhile), and its successor's PID
        self._handing_over = False
        self.handed_to: int | None = None
        #: SIGUSR2 on a leader: step down first (`_step_down`), then hand over as a standby
        self._stepping_down = False
        self._upgrade_pending = False
        #: set once the election key was read (a new process reports READY then)
        self._observed = asyncio.Event()
        #: whether the leader's lease was renewing at our last look at etcd (`ha.lease.renewing`)
        self._leader_renewing = False
        self.front_up = False
        self.stopping = asyncio.Event()
        self._cooldown_until = 0.0
        self.progress_key = progress_prefix(args.ha_group) + self.node.encode()
        self._published: tuple[int | None, Progress] | None = None
        self._etcd_down_logged = False

    # --- status ----------------------------------------------------------------------

    def _standby_store(self) -> Store | None:
        sb = self.standby
        return sb.store if sb is not None else None

    def _status(self) -> tuple[str, int | None, str | None, dict[str, object]]:
        v = self.view
        sb = self.standby
        store = self._standby_store()
        seq, head = store.head() if store is not None else (None, None)
        extra: dict[str, object] = {
            "node": self.node,
            "seq": seq,
            "hash_head": head.hex() if head is not None else None,
            "standby_state": sb.state if sb is not None else None,
            "leader_link": sb.link if sb is not None else None,
            # A standby sets diverged histories aside here (.diverged-<ms>): listed so that
            # they are found and removed (`mercury prune-aside`) before they fill the disk.
            "set_aside": [
                s.to_dict(time.time_ns() // 1_000_000) for s in setaside.listing(self.data_dir)
            ],
        }
        routable = may_route(v, self._leader_renewing, sb is not None and sb.link_lost)
        leader_url = v.leader.url if routable and v.leader is not None else None
        if v.leader is not None and v.role is Role.STANDBY and not routable:
            # Named so that the 503 says why, but no client is sent there.
            extra["unconfirmed_leader"] = v.leader.url
        # Won but its root not serving yet (this listener is about to close): not a leader
        # anyone can write to, so the answer is an election's.
        role = Role.ELECTING if v.role is Role.LEADER else v.role
        return role.value, v.term, leader_url, extra

    # --- run -------------------------------------------------------------------------

    async def run(self) -> int:
        """Campaign, lead or stand by until SIGTERM/SIGINT; then resign."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        # SIGUSR2: a standby hands over to the new executable (`_hand_over`); a leader
        # steps down first (`_step_down`), then does the same.
        loop.add_signal_handler(signal.SIGUSR2, self._usr2)
        log.info(
            "candidate %s of group %s (etcd %s, lease %ds)",
            self.node,
            self.args.ha_group,
            ",".join(self.etcd.urls),
            self.ttl,
        )
        await self.front.start()
        self.front_up = True
        lease = loop.create_task(self._lease_loop(), name="ha-lease")
        elect = loop.create_task(self._elect_loop(), name="ha-elect")
        take = loop.create_task(self._take_over(), name="ha-take-over") if self.inheriting else None
        try:
            await self.stopping.wait()
        finally:
            for t in (elect, take):
                if t is not None:
                    t.cancel()
                    await asyncio.gather(t, return_exceptions=True)
            # The lease keeps being renewed while a leading root commits and answers its
            # open batch; then it is revoked.
            await self._stop_child()
            lease.cancel()
            await asyncio.gather(lease, return_exceptions=True)
            await self._shutdown()
        return 0

    async def _stop_child(self) -> None:
        if self.child is not None:
            child, self.child = self.child, None
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)  # commits and answers its open batch
            try:
                await asyncio.wait_for(child.wait(), 30)
            except TimeoutError:
                child.kill()
                await child.wait()

    async def _shutdown(self) -> None:
        await self._stop_child()
        warm, self._warm_child = self._warm_child, None
        if warm is not None and warm.returncode is None:
            assert warm.stdin is not None
            warm.stdin.close()  # EOF: it exits without opening anything
            try:
                await asyncio.wait_for(warm.wait(), 10)
            except TimeoutError:
                warm.kill()
                await warm.wait()
        if self.lease is not None:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(self.lease)  # our key goes: the others elect now
        await self._stop_standby()  # the store closed, its writer lock free: the new one opens it
        if self.front_up:
            if self.handed_to is not None:
                # The successor accepts on the same socket: only the requests in flight here
                # (a forwarded write waits for the leader's answer) are left to finish.
                await self.front.drain(getattr(self.args, "drain_s", 10.0))
            else:
                await self.front.stop()
        await self.etcd.close()
        await self.front.close()
        log.info("candidate stopped")

    # --- lease -----------------------------------------------------------------------

    async def _lease_loop(self) -> None:
        every = renew_interval(self.ttl)
        while True:
            sent = time.monotonic()
            try:
                if self.lease is None:
                    lease, ttl = await self.etcd.grant(self.ttl)
                    self.lease = lease
                    self.clock.renewed(sent, ttl)
                else:
                    ttl = await self.etcd.keepalive(self.lease)
                    if ttl <= 0:
                        log.warning("lease %x expired", self.lease)
                        self.lease = None
                        self.clock.lost()
                    else:
                        self.clock.renewed(sent, ttl)
                self._etcd_down_logged = False
            except EtcdError as err:
                if not self._etcd_down_logged:
                    log.warning("lease renewal failed: %s", err)
                    self._etcd_down_logged = True
            self._tell_child()
            now = time.monotonic()
            if self.child is not None and not self.clock.valid(now):
                await self._depose("lease deadline passed without renewal")
            left = self.clock.left(now)
            await asyncio.sleep(max(0.02, min(every, left) if left > 0 else every))

    def _tell_child(self) -> None:
        child = self.child
        if child is not None and child.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                child.stdin.write(f"{self.clock.deadline!r}\n".encode())

    # --- election --------------------------------------------------------------------

    async def _elect_loop(self) -> None:
        while True:
            try:
                view = await self._observe()
            except EtcdError as err:
                # etcd unreachable: a leader keeps leading only until its deadline (the
                # lease loop fences it); a standby keeps following what it follows.
                if not self._etcd_down_logged:
                    log.warning("election key unreadable: %s", err)
                    self._etcd_down_logged = True
                view = self.view
                self._leader_renewing = False  # unconfirmed: nobody is sent there
                if view.role is Role.LEADER and not self.clock.valid(time.monotonic()):
                    view = View(Role.ELECTING, None)
            await self._become(view)
            self._observed.set()
            await asyncio.sleep(POLL_S)

    async def _observe(self) -> View:
        kv = await self.etcd.get(self.key)
        leader, key_lease = self._decode(kv)
        now = time.monotonic()
        valid = self.clock.valid(now)
        view = decide(self.node, self.lease, leader, key_lease, valid)
        if view.role is Role.STANDBY:
            left, granted = await self.etcd.time_to_live(key_lease)
            self._leader_renewing = renewing(left, granted)
        else:
            self._leader_renewing = False
        mine = self._progress() if view.role is not Role.LEADER else None
        # A new process publishes only once the old one stopped (and revoked its lease,
        # with the progress key it had bound to it): the key names one node, not a process.
        if mine is not None and self.lease is not None and not self.inheriting:
            await self._publish(mine)
        if (
            leader is None
            and not self.inheriting
            and not self._handing_over
            and mine is not None
            and self.lease is not None
            and now >= self._cooldown_until
            and may_campaign(layout.exists(self.data_dir), valid, mine, await self._others())
        ):
            me = LeaderInfo(self.node, self.url, self.repl, 0)
            won, kv = await self.etcd.create(self.key, me.encode(), self.lease)
            leader, key_lease = self._decode(kv)
            view = decide(self.node, self.lease, leader, key_lease, self.clock.valid(now))
            if won:
                log.info("won the election: term %d", view.term)
        return view

    def _progress(self) -> Progress | None:
        """How far this node's store is (None: no store yet, or one being bootstrapped)."""
        sb = self.standby
        if sb is not None and sb.store is not None:
            return store_term(sb.store), sb.applied
        if sb is not None and sb.state == "bootstrapping":
            return None
        if not layout.exists(self.data_dir):
            return None
        # No handle of ours is open on it now (the standby holds none): a short read-only
        # look (opened and closed without yielding, so the standby cannot open it meanwhile).
        try:
            store = Store.open(self.data_dir, readonly=True)
        except MercuryError as err:
            log.error("store unreadable: %s", err)
            return None
        try:
            return store_term(store), store.last_seq()
        finally:
            store.close()

    async def _publish(self, mine: Progress) -> None:
        """Tell the other candidates how far this store is (bound to our lease)."""
        if self._published != (self.lease, mine) and self.lease is not None:
            await self.etcd.put(self.progress_key, encode_progress(mine), self.lease)
            self._published = (self.lease, mine)

    async def _others(self) -> list[Progress]:
        """How far the other live candidates' stores are."""
        out = []
        for k, kv in (await self.etcd.prefix(progress_prefix(self.args.ha_group))).items():
            if k != self.progress_key:
                with contextlib.suppress(ValueError):
                    out.append(decode_progress(kv.value))
        return out

    @staticmethod
    def _decode(kv: object) -> tuple[LeaderInfo | None, int]:
        from ha.etcd import KeyValue

        if not isinstance(kv, KeyValue):
            return None, 0
        try:
            return LeaderInfo.decode(kv.value, kv.create_revision), kv.lease
        except ValueError as err:
            log.error("%s", err)
            return None, 0

    async def _become(self, view: View) -> None:
        if view != self.view:
            log.info(
                "role %s, term %s, leader %s",
                view.role.value,
                view.term,
                view.leader.node if view.leader else None,
            )
        self.view = view
        if view.role is Role.LEADER:
            assert view.term is not None
            if self._stepping_down:
                await self._step_down(view.term)
                return
            if self._upgrade_pending:
                # No standby took the lead within the cool-down: leading again beats no
                # leader at all; the operator sends SIGUSR2 again once a standby is in sync.
                self._upgrade_pending = False
                _event("handover-failed", why="no standby took the lead; leading again")
            if self.child is None:
                await self._lead(view.term)
            return
        if self.child is not None:
            await self._depose("another candidate holds the election key")
        if not self.front_up:
            await self.front.start()
            self.front_up = True
        if self.inheriting:
            return  # the old process still holds the store (`_take_over`)
        if layout.exists(self.data_dir):
            await self._warm()
        if view.role is Role.STANDBY and view.leader is not None and view.term is not None:
            src = parse_hostport(view.leader.repl, "leader replication address")
            sb = self.standby
            if sb is None or sb.source != src or sb.leader_term != view.term:
                await self._stop_standby()
                self.standby = Standby(self.data_dir, src, view.term, self.tls)
                self.standby.start()
        if (
            self._upgrade_pending
            and view.role is Role.STANDBY
            and self.standby is not None
            and self.standby.state == "streaming"
        ):
            # Stepped down and following the new leader: now hand over as a standby does.
            self._upgrade_pending = False
            self._usr2()

    async def _stop_standby(self) -> None:
        if self.standby is not None:
            sb, self.standby = self.standby, None
            await sb.stop()

    # --- hand-over (kill -USR2) ---------------------------------------------------------

    def _usr2(self) -> None:
        if self._handing_over or self.handed_to is not None or self.inheriting:
            log.warning("SIGUSR2: a hand-over is under way; ignored")
            return
        if self._stepping_down or self._upgrade_pending:
            log.warning("SIGUSR2: stepping down for a hand-over already; ignored")
            return
        if self.child is not None or self.view.role is Role.LEADER:
            # A leader hands the lead to a standby first (docs/ha.md: its lease and term are
            # not passed on); the election loop does it (`_step_down`), so that it never
            # races `_lead` starting a root again.
            _event("handover-step-down", term=self.view.term)
            self._stepping_down = True
            return
        self._handing_over = True
        asyncio.get_running_loop().create_task(self._hand_over(), name="ha-hand-over")

    async def _hand_over(self) -> None:
        """Start the new executable with the front's socket; once it is READY, stop here:
        the lease is revoked, the standby's store closed (the new process opens it and
        rejoins as a standby), the front's requests in flight finished; exit 0."""
        try:
            sock = self.front.listening_socket()
            if sock is None:
                log.warning("SIGUSR2: the front is not listening; no hand-over")
                return
            # A copy: the front and the new process hold the socket (closed once passed).
            succ = await handover.hand_over(
                "candidate",
                {handover.HTTP: sock},
                wait_for=handover.READY,
                timeout=getattr(self.args, "handover_timeout_s", 60.0),
            )
            if succ is None:
                return
            self.handed_to = succ.pid
            succ.close()
            self.stopping.set()
        except Exception:
            log.exception("hand-over failed; still serving")
        finally:
            if self.handed_to is None:
                self._handing_over = False

    async def _step_down(self, term: int) -> None:
        """Leader, on SIGUSR2: stop the root cleanly (it answers its open batch and waits
        until the standbys confirmed everything it committed), delete the election key and
        revoke the lease (a standby wins at once, not after the TTL) and keep out of the
        next election for `COOLDOWN_S`; once following the new leader, hand over."""
        await self._stop_child()  # the root gone: nobody writes for this term any more
        self._cooldown_until = time.monotonic() + COOLDOWN_S
        await self._resign(term)
        self._stepping_down = False
        self._upgrade_pending = True
        _event("stepped-down", term=term)

    async def _take_over(self) -> None:
        """A new process: READY once its front serves and the election key was read (it
        routes writers like the old one); then, once the old process released the store
        (its writer lock), follow the leader as a standby."""
        await self._observed.wait()
        handover.report(handover.READY)
        bound = getattr(self.args, "drain_s", 10.0) + getattr(self.args, "handover_timeout_s", 60.0)
        deadline = time.monotonic() + bound
        while True:
            try:
                # Taken and given back at once: the standby takes it for good (`Standby._run`).
                WriterLock.acquire(self.data_dir).release()
                break
            except StoreLockedError:
                if time.monotonic() > deadline:
                    log.error("the old process kept the store %.0f s; starting anyway", bound)
                    break
                await asyncio.sleep(0.02)
        _event("writer-lock", how="handover")
        self.inheriting = False

    # --- leading ---------------------------------------------------------------------

    async def _warm(self) -> asyncio.subprocess.Process:
        """The warm root process (started now if there is none or it died)."""
        w = self._warm_child
        if w is None or w.returncode is not None:
            argv = [sys.executable, "-m", "mercury", *sys.argv[1:], "--ha-await-go"]
            # The root serves on the front's own listening socket (a copy inherited now):
            # once elected it accepts from the same queue the front stops accepting from,
            # so the address is never closed while this candidate turns leader.
            sock = self.front.listening_socket()
            env = dict(os.environ)
            fds: tuple[int, ...] = ()
            if sock is not None:
                env[handover.HANDOVER_FDS_ENV] = handover.format_handover_fds(
                    {handover.HTTP: sock.fileno()}
                )
                fds = (sock.fileno(),)
            try:
                w = self._warm_child = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    preexec_fn=lifeline.kill_with_parent,
                    env=env,
                    pass_fds=fds,
                )
            finally:
                if sock is not None:
                    sock.close()
        return w

    async def _lead(self, term: int) -> None:
        child = await self._warm()
        self._warm_child = None
        await self._stop_standby()  # closes the store and frees the writer lock
        if self.front_up:
            # The root's gateway accepts on the same socket once it has its GO: the front
            # stops accepting, lets its answers in flight (election 503s, forwards) finish
            # for a moment, and keeps the socket (clients queue, none is refused).
            await self.front.drain(LEAD_DRAIN_S)
            self.front_up = False
        assert child.stdin is not None
        child.stdin.write(f"{term} {self.clock.deadline!r}\n".encode())
        self.child = child
        self.child_term = term
        log.info("leading: root process %d for term %d", child.pid, term)
        asyncio.get_running_loop().create_task(self._watch_child(child, term))

    async def _watch_child(self, child: asyncio.subprocess.Process, term: int) -> None:
        code = await child.wait()
        if self.child is not child:
            return  # we stopped it ourselves
        self.child = None
        log.error("root process of term %d exited with %s; resigning", term, code)
        self._cooldown_until = time.monotonic() + COOLDOWN_S
        await self._resign(term)

    async def _resign(self, term: int) -> None:
        lease, self.lease = self.lease, None
        self.clock.lost()
        with contextlib.suppress(EtcdError):
            await self.etcd.delete_if(self.key, term)
        if lease is not None:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(lease)
        self.view = View(Role.ELECTING, None)

    async def _depose(self, why: str) -> None:
        """Stop the leading root now: it may be acknowledging without a lease."""
        child, self.child = self.child, None
        if child is None:
            return
        log.error("deposed (%s): killing root process %d", why, child.pid)
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
        if self.child_term is not None:
            await self._resign(self.child_term)


def _event(name: str, **fields: object) -> None:
    """One structured line (``{"event": name, ...}``), as the roots' and replicas' are."""
    log.info(json.dumps({"event": name, "role": "candidate", **fields}, default=str))


def run_candidate(args: argparse.Namespace, files: TlsFiles | None) -> int:
    """Run a root candidate until SIGTERM/SIGINT; `files` are its TLS files (None: plain),
    as the wiring read them from the flags."""
    eventloop.install()
    return asyncio.run(Candidate(args, files).run())
