"""A candidate's standby side: follow the leader with the replica client, report upstream.

A standby is a replica whose source is the current leader: the replication client and
applier of `replicator/` run in the candidate's process on its own store (no read
listeners: its gateway address redirects to the leader). After each durable apply, and at
least every `REPORT_EVERY_S` while connected, it sends its applied seq upstream
(`upstream.APPLIED`): the leader acknowledges a batch only once enough standbys did.

Before following a leader, `history_matches` compares this store's last log record with the
leader's record at the same seq: a deposed leader that committed a tail nobody
acknowledged (or a standby that applied it) holds a history the new leader does not. Such a
store, or one the leader can no longer stream to (history collected), is moved aside into
``DATA_DIR/.diverged-<time>/`` (kept for inspection) and the standby bootstraps a fresh
copy from the leader. An empty DATA_DIR bootstraps the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
import uuid

from core.errors import (
    BootstrapNeededError,
    LogRetentionError,
    ProtocolError,
    RefusedError,
    SnapshotTransferError,
)
from core.tasks import cancel_and_wait
from net.tlsconf import TlsContexts
from replicator import bootstrap, frames, upstream, wire
from replicator.client import ReplicaClient, ReplicationFailed
from replicator.heartbeat import RelayedHeartbeat
from replicator.selection import Selector
from replicator.status import StatusBoard
from replicator.tcp import TcpTransport
from replicator.terms import store_term
from replicator.transport import Transport
from store import layout
from store.lock import WriterLock
from store.ops import LogRecord
from store.store import Store
from store.terms import StaleTermError, TermGuard

log = logging.getLogger("mercury.ha.standby")

REPORT_EVERY_S = 0.5
#: The GIL switch interval of a standby's process (the root's default too, Python's is 5 ms).
SWITCH_INTERVAL_S = 0.0005
PROBE_TIMEOUT_S = 5.0


class _ReportingClient(ReplicaClient):
    """The replica client that also reports each durable apply upstream."""

    def _hello(self, options: int) -> bytes:
        # A standby gets what the leader committed at once (it confirms it); replicas
        # get only what standbys confirmed.
        return super()._hello(options | frames.OPT_STANDBY)

    def _applied(self, rec: LogRecord) -> None:
        super()._applied(rec)
        # The apply thread commits a group of records in one transaction and then reports
        # each: one APPLIED frame per group (its last record) is enough, and each frame
        # costs the leader's loop a dispatch. A record below the store's last seq is
        # followed by the report of one at least as far (already durable): skip it.
        if self.outbox is not None and rec.last_seq >= self.store.last_seq():
            self.outbox.send(upstream.APPLIED, upstream.encode_applied(rec.last_seq))


async def history_matches(
    host: str,
    port: int,
    store: Store,
    node_id: bytes,
    tls: TlsContexts | None = None,
    *,
    transport: Transport | None = None,
) -> bool:
    """Whether this store's history is a prefix of the source's (False: diverged, or the
    source no longer holds what this store would continue from), asked over `transport`
    (None: TCP, with mutual TLS when `tls`). OSError/TimeoutError/ProtocolError when the
    source cannot be asked."""
    seq, _head = store.head()
    if seq == 0:
        return True
    mine: LogRecord | None = None
    with contextlib.suppress(LogRetentionError):
        recs = store.read_log(seq, max_records=1)
        if recs and recs[0].first_seq <= seq <= recs[0].last_seq:
            mine = recs[0]
    after = mine.first_seq - 1 if mine is not None else seq
    db_id = uuid.UUID(store.db_id).bytes
    hello = frames.Hello(
        frames.PROTOCOL_VERSION,
        frames.MODE_STREAM,
        frames.OPT_STANDBY,  # the leader's unconfirmed records too: we compare our tail
        node_id,
        db_id,
        after,
        mine.first_seq if mine is not None else 0,
        0,
        frames.ZERO_SHA,
    )
    transport = transport or TcpTransport(tls)
    async with asyncio.timeout(PROBE_TIMEOUT_S):
        link = await transport.connect(host, port, timeout=None)
        try:
            await link.send(frames.encode_hello(hello))
            ftype, _, raw, _ = await link.recv()
            body = bytes(raw)
            if ftype == frames.REFUSE:
                refusal = frames.decode_refuse(body)
                log.warning("history probe refused by %s:%d: %s", host, port, refusal.message)
                if refusal.code in (frames.REFUSE_BOOTSTRAP, frames.REFUSE_DB_ID):
                    return False  # this store cannot continue from that leader
                raise RefusedError(f"history probe refused: {refusal.message}")
            if ftype != frames.WELCOME:
                raise ProtocolError(f"expected WELCOME, got frame type {ftype}")
            welcome = frames.decode_welcome(body)
            if welcome.db_id != db_id:
                return False
            if welcome.head_seq < seq:
                log.warning(
                    "this store holds seq %d, the leader only %d: an unacknowledged tail",
                    seq,
                    welcome.head_seq,
                )
                return False
            if mine is None:
                return True  # nothing to compare: the chain check on apply decides
            while True:
                ftype, _, raw, _ = await link.recv()
                if ftype == frames.RECORD:
                    theirs = wire.parse_record(bytes(raw))
                    same = (theirs.first_seq, theirs.num_entries, theirs.hash_head) == (
                        mine.first_seq,
                        mine.num_entries,
                        mine.hash_head,
                    )
                    if not same:
                        log.warning(
                            "history differs from the leader's at seq %d: mine %s, theirs %s",
                            mine.first_seq,
                            mine.hash_head.hex(),
                            theirs.hash_head.hex(),
                        )
                    return same
                if ftype == frames.REFUSE:
                    return False
        finally:
            await link.close()


def move_aside(data_dir: str) -> str:
    """Move the store files of `data_dir` into a new ``.diverged-<time>`` directory."""
    dest = os.path.join(data_dir, f".diverged-{time.time_ns() // 1_000_000}")
    os.makedirs(dest, exist_ok=True)
    for name in ("data.mdb", "lock.mdb", "replication.json"):
        src = os.path.join(data_dir, name)
        if os.path.exists(src):
            os.replace(src, os.path.join(dest, name))
    return dest


class Standby:
    """Follows one leader's replication address until stopped."""

    def __init__(
        self,
        data_dir: str,
        source: tuple[str, int],
        leader_term: int,
        tls: TlsContexts | None = None,
    ) -> None:
        self.data_dir = data_dir
        #: mutual TLS to the leader's replication source (None: plaintext)
        self.tls = tls
        self.source = source
        self.leader_term = leader_term
        self.node_id = uuid.uuid4().bytes
        self.store: Store | None = None
        self.state = "starting"
        self._task: asyncio.Task[None] | None = None
        #: the upstream outbox of the current session (its `connected` is the link's state)
        self._outbox: upstream.UpstreamOutbox | None = None
        #: whether a session to this leader was ever up
        self._linked = False

    @property
    def applied(self) -> int:
        """Last applied seq (0 without a store)."""
        return self.store.last_seq() if self.store is not None else 0

    @property
    def link(self) -> str:
        """The replication link to this leader: "up", "lost" (it was up and is down now:
        a leader whose process died closes it at once, long before its lease expires) or
        "none" (never up yet: bootstrapping, or still connecting)."""
        box = self._outbox
        if box is not None and box.connected:
            return "up"
        return "lost" if self._linked else "none"

    @property
    def link_lost(self) -> bool:
        """Whether `link` is "lost"."""
        return self.link == "lost"

    def start(self) -> None:
        """Start following (on the running loop)."""
        log.info("standby following %s:%d (term %d)", *self.source, self.leader_term)
        # The apply thread and the loop hand the GIL to each other around every applied
        # batch (records in, the report out); at Python's 5 ms interval each handoff may
        # wait that long, on the path every acknowledgement of the leader waits for.
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._task = asyncio.get_running_loop().create_task(self._run(), name="ha-standby")

    async def stop(self) -> None:
        """Stop following; the store is closed and the writer lock released on return."""
        if self._task is not None:
            await cancel_and_wait(self._task)  # a swallowed cancellation would hang here
            self._task = None

    async def _run(self) -> None:
        lock = WriterLock.acquire(self.data_dir)
        try:
            while True:
                try:
                    await self._follow()
                    return
                except (ReplicationFailed, BootstrapNeededError) as err:
                    log.warning("standby store must be re-bootstrapped: %s", err)
                    self._close()
                    log.warning("old store moved to %s", move_aside(self.data_dir))
                except (OSError, TimeoutError, ProtocolError, RefusedError) as err:
                    self.state = "reconnecting"
                    log.info("leader %s:%d not reachable: %s", *self.source, err)
                    self._close()
                    await asyncio.sleep(0.3)
                except Exception:
                    # Anything else (a store error in the apply thread, a bug) must not end
                    # this task quietly: the standby would stop confirming and its leader
                    # answer 503 for good. Said loudly, then the session starts over.
                    self.state = "failed"
                    log.exception("standby of %s:%d failed; restarting", *self.source)
                    self._close()
                    await asyncio.sleep(1.0)
        finally:
            self._close()
            lock.release()
            log.info("standby of %s:%d stopped", *self.source)

    def _close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    async def _follow(self) -> None:
        host, port = self.source
        if not layout.exists(self.data_dir):
            await self._bootstrap()
        store = self.store = Store.open(self.data_dir, sync=True)
        try:
            # This store may already hold a newer leadership than the one etcd showed us
            # (a stale view; the next poll corrects it): never follow an older term.
            TermGuard(store_term(store)).check(self.leader_term, "leader")
        except StaleTermError as err:
            self.state = "fenced"
            log.error("%s", err)
            await asyncio.sleep(1.0)
            raise ProtocolError(str(err)) from err
        if not await history_matches(host, port, store, self.node_id, self.tls):
            raise ReplicationFailed(
                "this store's history is not the leader's (unacknowledged tail)"
            )
        outbox = self._outbox = upstream.UpstreamOutbox()
        outbox.on_connect(self._on_link)
        board = StatusBoard(self.data_dir)
        board.start()
        client = _ReportingClient(
            store,
            Selector([self.source]),
            node_id=self.node_id,
            board=board,
            relay=RelayedHeartbeat(),
            staleness=10.0,
            failback=0.0,
            tls=self.tls,
            outbox=outbox,
        )
        reporter = asyncio.get_running_loop().create_task(self._report(outbox, client))
        self.state = "streaming"
        try:
            await client.run()
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            await board.stop()

    def _on_link(self) -> None:
        self._linked = True

    async def _report(self, outbox: upstream.UpstreamOutbox, client: ReplicaClient) -> None:
        # Idle standbys report too: the leader counts only standbys heard from lately.
        while True:
            if outbox.connected:
                outbox.send(upstream.APPLIED, upstream.encode_applied(client.applied))
            await asyncio.sleep(REPORT_EVERY_S)

    async def _bootstrap(self) -> None:
        host, port = self.source
        self.state = "bootstrapping"
        board = StatusBoard(self.data_dir)
        while True:
            try:
                offer = await bootstrap.fetch(
                    host,
                    port,
                    self.data_dir,
                    node_id=self.node_id,
                    db_id=frames.ZERO_ID,
                    board=board,
                    tls=self.tls,
                )
                break
            except (SnapshotTransferError, ProtocolError, RefusedError, OSError) as err:
                log.info("bootstrap from %s:%d: %s; retrying", host, port, err)
                await asyncio.sleep(0.5)
        bootstrap.install(self.data_dir, offer).close()
        log.info("bootstrapped from %s:%d at seq %d", host, port, offer.seq)
