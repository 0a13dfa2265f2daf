"""The replication source: an asyncio TCP server streaming the store's log to replicas.

Runs on the root (beside the gateway, on the gateway's event loop) and on every replica (in
its replication worker). Contract:

- Handshake (`frames.HELLO`): refuses with a named code when the client's id is this
  source's own id (replicating from itself), when the db ids differ, and when the client's
  next seq is older than the retained log (bootstrap needed).
- Streaming: log records from the client's last seq + 1 in order, each in one RECORD frame
  exactly as stored. A commit wakes every stream at once — through the store's in-process
  commit listener, the cross-process ping (`replicator/notify.py`) and a slow safety poll —
  never a busy poll. An in-process commit's listener reads what was just committed in the
  committing thread and hands it to the loop (`_Tail`): a caught-up stream gets it written
  from that wake-up at once, with no log read of its own. Other log reads run in a worker
  thread so a long catch-up never blocks the loop (on the root it serves the gateway too).
- Heartbeats: when nothing else is sent, one HEARTBEAT frame per interval from
  `heartbeat.current()`; a newer relayed heartbeat is forwarded at once. A head-aware
  client (`frames.OPT_HEADS`) gets the root's hash head in each.
- A node whose own replication stopped as diverged (`stop_as_diverged`) ends every stream
  with a `REFUSE_DIVERGED` naming a point of its abandoned history and refuses every new
  HELLO the same way: a replica below it holding that point stops as diverged too, and no
  one bootstraps that history from it.
- Bootstrap (`MODE_SNAPSHOT`): at most `max_bootstraps` transfers at a time (others get
  WAIT frames until their turn). A snapshot is made in one short read transaction by
  `store.snapshot.make_snapshot` and then sent from its file with sendfile — no read
  transaction is held during the transfer. A client resuming a cut transfer names the
  snapshot's SHA-256 and the bytes it holds; while that snapshot is kept, the transfer
  continues from there.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import glob
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from core.errors import LogRetentionError, MercuryError, ProtocolError
from net.budget import Budget, Principal, Reason, peer_principal
from net.tlsconf import TlsContexts
from replicator import filter as keyspace
from replicator import frames, handshake, invalidation, notify
from replicator.filtered_stream import FilteredSession
from replicator.heartbeat import HeartbeatSource
from replicator.metrics import REFUSED
from replicator.runtime import PROCESS, Runtime
from replicator.tcp import TcpTransport
from replicator.terms import store_term
from replicator.transport import Link, LinkRefused, Listener, Transport
from replicator.upstream import Origin, UpstreamRouter
from store import prune, snapshot
from store.filtered import describe
from store.ops import LogRecord
from store.store import Store

log = logging.getLogger("mercury.replication.source")

#: Bounds of one log read (and so of one burst of frames between two drains).
READ_RECORDS = 256
READ_BYTES = 4 << 20
#: The handshake: a connection that has not sent its whole HELLO by then is closed.
HELLO_TIMEOUT = 10.0
#: A snapshot transfer (or a WAIT frame) that makes no progress for this long is closed
#: and frees its bootstrap slot: a replica that asks for a snapshot and never reads must
#: not block every other one.
STALL_TIMEOUT = 30.0
#: Connections served at once (streams, bootstraps and handshakes). At the cap a newcomer
#: takes the slot of the connection that has waited longest for its HELLO (`_Conn`); it
#: is closed at once only when every slot is a stream or a transfer.
MAX_CONNECTIONS = 256
#: The part of a full cap one peer address may hold (`net.budget.share_cap`): at its share
#: a newcomer of that address only displaces its own connections still without a HELLO.
PRINCIPAL_SHARE = 0.25
#: A kept snapshot is reused for new bootstraps while younger than this.
SNAPSHOT_MAX_AGE = 300.0
#: A replica's first frame must be a HELLO (92 bytes): anything else closes at its header.
_FIRST_FRAME = frozenset({frames.HELLO})
#: A filtered replica's second (`frames.OPT_KEYSPACES`).
_KEYSPACES_FRAME = frozenset({frames.KEYSPACES})
#: Frames smaller than this are joined into one write of at least this size: one TLS
#: record run and one system call for many small log records instead of one each.
_COALESCE = 64 << 10
#: Bytes of recently committed records kept for streams that are caught up (see `_Tail`).
TAIL_BYTES = 4 << 20


class _Conn:
    """A replication connection as the connection budget (`net.budget`) sees it. Until its
    HELLO is accepted (its TLS handshake and first frame still to come) it has made no
    progress and may be evicted at the cap, the longest waiting first: a peer that opens
    connections and sends nothing (or a HELLO a byte at a time) must not hold the cap a
    replica needs for `hello_timeout` at a time, again and again. Once its HELLO is
    accepted its stream or snapshot transfer is never evicted (its own stall timeout
    bounds a replica that takes nothing)."""

    __slots__ = ("link", "since", "task")

    def __init__(self, task: asyncio.Task[None], link: Link) -> None:
        self.task = task
        self.link = link
        #: Since when it waits for its HELLO (None: accepted, being served).
        self.since: float | None = time.monotonic()

    def idle_since(self) -> float | None:
        return self.since

    def stalled_since(self) -> float | None:
        return None

    def gone(self) -> bool:
        return self.link.closing()

    def evict(self) -> None:
        self.link.abort()  # its descriptor goes now, not when its task next runs
        self.task.cancel()


def _link_principal(link: Link) -> Principal:
    """The peer address a connection holds its slot for (`Link.address`, "host:port")."""
    host, _, _port = link.address.rpartition(":")
    return peer_principal((host or link.address,))


#: `mercury_repl_refused{reason}` of the connection budget's refusals and evictions.
_BUDGET_LABELS = {
    Reason.REFUSED: "too_many",
    Reason.SHARE_REFUSED: "share_refused",
    Reason.EVICTED: "evicted",
    Reason.SHARE: "share_evicted",
}


@dataclass
class BootstrapStats:
    """What the source did for bootstraps (tests and `status()` read it)."""

    active: int = 0
    peak: int = 0
    served: int = 0
    #: (sha256 hex, offset) of every transfer started.
    transfers: list[tuple[str, int]] = field(default_factory=list)
    bytes_sent: int = 0
    #: Transfers closed because the replica stopped reading.
    stalled: int = 0


class ReplicationSource:
    """Serves the log of `store` on `host:port` (port 0 picks a free one; see `port`) over
    `transport` (None: TCP, with mutual TLS when `tls`)."""

    name = "replication-source"

    def __init__(
        self,
        store: Store,
        host: str,
        port: int,
        *,
        node_id: bytes,
        heartbeat: HeartbeatSource,
        max_bootstraps: int = 1,
        snapshot_dir: str | None = None,
        max_connections: int = MAX_CONNECTIONS,
        principal_share: float = PRINCIPAL_SHARE,
        stall_timeout: float = STALL_TIMEOUT,
        hello_timeout: float = HELLO_TIMEOUT,
        tls: TlsContexts | None = None,
        upstream: UpstreamRouter | None = None,
        transport: Transport | None = None,
        runtime: Runtime = PROCESS,
    ) -> None:
        self.store = store
        self.transport: Transport = transport or TcpTransport(tls, handshake_timeout=hello_timeout)
        #: Its clocks and where its log reads and snapshots run (`replicator/runtime.py`).
        self.runtime = runtime
        #: Reads UPSTREAM frames of clients that offer them (None: never offered).
        self.upstream = upstream
        #: On an HA leader: the highest seq its standbys confirmed. Replicas other than
        #: standbys (`frames.OPT_STANDBY`) are streamed only up to it, so none ever holds a
        #: record a failover can undo (None: stream everything committed).
        self.horizon: Callable[[], int] | None = None
        #: Mutual TLS on every connection (None: plaintext, loopback deployments only).
        self.tls = tls
        self.host = host
        self.port = port
        self.node_id = node_id
        self.heartbeat = heartbeat
        # A relayed heartbeat is forwarded as soon as a newer one arrives; the root's own
        # is made fresh each time and sent once per interval.
        self._relays = hasattr(heartbeat, "update")
        self.stats = BootstrapStats()
        self.max_connections = max_connections
        self.stall_timeout = stall_timeout
        self.hello_timeout = hello_timeout
        self.refused_connections = 0
        #: Told each refusal's reason (a replica's worker publishes its counts to its parent).
        self.on_refused: Callable[[str], None] = lambda _reason: None
        self._db_id = _uuid_bytes(store.db_id)
        self._slots = asyncio.Semaphore(max_bootstraps)
        self._queue: list[object] = []
        #: Transfers holding a slot: token -> (peer, bytes sent so far), for the logs.
        self._holders: dict[object, tuple[object, int]] = {}
        self._snapshot_dir = snapshot_dir or os.path.join(store.path, "snapshots")
        self._snapshot: tuple[str, snapshot.SnapshotInfo, float] | None = None
        self._snapshot_lock = asyncio.Lock()
        # Dicts, not sets: streams are woken in the order they started (a set's order
        # follows object addresses, and a simulation must replay the same way).
        self._waiters: dict[asyncio.Event, None] = {}
        self._tail = _Tail()
        #: Streams waiting for the next commit, by their event: `_tail_arrived` sends them
        #: its records at once (see `_Caught`).
        self._caught: dict[asyncio.Event, _Caught] = {}
        self._tail_lock = threading.Lock()
        #: First seq the next commit's tail read starts at (None: resync at the next one).
        self._tail_next: int | None = None
        #: The streams `horizon` holds back (plain replicas of an HA leader): a standby's
        #: report moves the horizon and wakes these only.
        self._held: dict[asyncio.Event, None] = {}
        #: The tasks of the connections admitted (streams, bootstraps and handshakes).
        self._conns: set[asyncio.Task[None]] = set()
        #: The same connections, held to `max_connections` (`_Conn`).
        self._budget: Budget[_Conn] = Budget(
            max_connections, self._budget_count, share=principal_share
        )
        self._listener: Listener | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_listener: notify.WakeListener | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._closing = False
        #: The `REFUSE_DIVERGED` message once this node stopped as diverged (None: serving).
        self._diverged: str | None = None
        #: The keyspaces this node holds (a filtered replica's); None: every key. A
        #: replica asking for more, or for everything, is refused (`filter.refusal`).
        self.keyspaces: keyspace.Prefixes | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, hook commit notifications and start the safety poll."""
        self._loop = asyncio.get_running_loop()
        self.store.add_commit_listener(self._on_commit_threadsafe)
        self._wake_listener = notify.WakeListener(self.store.path, self.wake)
        self._wake_listener.start()
        self._listener = await self.transport.listen(self.host, self.port, self._handle)
        self.port = self._listener.address[1]
        self._poll_task = self._loop.create_task(self._poll())
        log.info("replication source listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close every connection (the listener cancels every
        connection's task, also one accepted as it closed)."""
        self._closing = True
        if self._poll_task is not None:
            self._poll_task.cancel()
        if self._wake_listener is not None:
            self._wake_listener.stop()
        if self._listener is not None:
            await self._listener.close()

    def stop_as_diverged(self, seq: int, head: bytes, why: str) -> None:
        """This node's replication stopped as diverged, holding hash head `head` at `seq`
        (a point of the abandoned history): from now on, end every stream and refuse every
        HELLO with `REFUSE_DIVERGED` (on the loop)."""
        self._diverged = frames.diverged_refusal(seq, head, why)
        log.error("refusing replicas from now on: %s", self._diverged)
        self.wake()

    def wake(self) -> None:
        """Wake every stream (on the loop): new log records or a newer heartbeat."""
        for ev in self._waiters:
            ev.set()

    def wake_held(self) -> None:
        """Wake the streams `horizon` holds back (on the loop): it moved. A standby's
        stream is not held back, and waking it for nothing costs a log read per report."""
        for ev in self._held:
            ev.set()

    def _on_commit_threadsafe(self, seq: int) -> None:
        """In the committing thread: read what was just committed and hand it to the loop
        with the wake-up, so a caught-up stream sends it at once. Reading it from the loop
        cost a round trip through a worker thread: two more turns of a loop that, on the
        root, also serves every writer, and an HA leader's acknowledgements wait for its
        standby to receive these records. Only commits of at most `TAIL_BYTES` are read
        here; a larger one is left to the streams' own reads."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with self._tail_lock:  # in commit order, also when commits come from two threads
            recs: list[LogRecord] | None = None
            start = self._tail_next
            if start is not None and self._waiters:
                try:
                    # `within`: a large commit is not copied here (it would delay the next
                    # commit); the streams then read it themselves.
                    got = self.store.read_log(
                        start, max_records=READ_RECORDS, max_bytes=TAIL_BYTES, within=True
                    )
                except Exception:  # a listener never raises; the streams read for themselves
                    got = []
                if got and got[0].first_seq <= start and got[-1].last_seq == seq:
                    recs = got
            # Without streams nothing is read: the tail starts over after the next commit.
            self._tail_next = seq + 1 if self._waiters else None
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._tail_arrived, recs)

    def _tail_arrived(self, recs: list[LogRecord] | None) -> None:
        """On the loop: keep `recs` (None: what was committed is not known, forget the
        tail), then wake every stream."""
        if recs is None:
            self._tail.clear()
        else:
            self._tail.extend(recs)
            for caught in self._caught.values():
                caught.send(recs)
        self.wake()

    async def _poll(self) -> None:
        # Safety net for a lost cross-process ping; a second is plenty, and cheap.
        last = -1
        while True:
            await asyncio.sleep(notify.POLL_SECONDS)
            seq = self.store.last_seq()
            if seq != last:
                last = seq
                self.wake()
            self._expire_snapshot()

    def _expire_snapshot(self) -> None:
        """Delete the kept snapshot once too old to be offered and no transfer runs (it
        is as big as the store; a resuming replica then simply starts over)."""
        kept = self._snapshot
        if kept is None or self.stats.active or self._snapshot_lock.locked():
            return
        path, _info, made = kept
        if self.runtime.monotonic() - made < 2 * SNAPSHOT_MAX_AGE:
            return
        self._snapshot = None
        for p in (path, snapshot.sidecar(path), *glob.glob(f"{path}.ks-*")):
            with contextlib.suppress(OSError):
                os.unlink(p)
        log.info("deleted expired snapshot %s", path)

    # --- connections -----------------------------------------------------------------

    def _admit(self, conn: _Conn) -> bool:
        """False (counted, logged) when the connection budget has no slot for `conn` (every
        one is a stream or a transfer, or its peer is at its share and none of its own may
        go): every connection costs buffers and a task, so the ones over the cap are closed
        before anything is read. False (silently) once the source is stopping: a connection
        accepted as the listener closed must not be served by a source that has stopped."""
        if self._closing:
            return False
        if self._budget.admit(conn, _link_principal(conn.link)):
            return True
        log.warning(
            "refused replica %s: %d connections open (the cap), none waiting for a HELLO "
            "it may close",
            conn.link.address,
            self.max_connections,
        )
        return False

    def _budget_count(self, reason: Reason) -> None:
        if reason in (Reason.REFUSED, Reason.SHARE_REFUSED):
            self.refused_connections += 1
        self._refused(_BUDGET_LABELS.get(reason, reason.value))

    async def _handle(self, link: Link) -> None:
        """One connection, from its acceptance (before the transport's own handshake)."""
        task = asyncio.current_task()
        assert task is not None
        peer = link.address
        conn = _Conn(task, link)
        if not self._admit(conn):
            await link.close()
            return
        self._conns.add(task)
        try:
            try:
                await link.handshake(self.hello_timeout)
            except LinkRefused as err:
                self._refused(err.reason)
                log.warning(
                    "refused replica %s: TLS handshake failed (%s: %s)",
                    peer,
                    err.reason,
                    err.detail,
                )
                return
            try:
                await self._serve(link, peer, conn)
            finally:
                await link.close()
        except asyncio.CancelledError:
            link.abort()
        finally:
            self._budget.leave(conn)
            self._conns.discard(task)

    async def _serve(self, link: Link, peer: str, conn: _Conn) -> None:
        """Handshake, then a stream or a snapshot transfer; every ending is logged."""
        try:
            ftype, _flags, body, _ok = await link.recv(self.hello_timeout, _FIRST_FRAME)
            if ftype != frames.HELLO:
                raise ProtocolError(f"expected HELLO, got frame type {ftype}")
            hello = frames.decode_hello(bytes(body))
            asked = await self._keyspaces_asked(hello, link)
            # Keyspaces first: a replica this source can never feed must not be told to
            # bootstrap from it.
            refusal = self._keyspace_refusal(asked) or self._refusal(hello)
            if refusal is not None:
                code, message = refusal
                self._refused(_REFUSAL_REASONS.get(code, "protocol"))
                log.warning("refused replica %s: %s", peer, message)
                await link.send(frames.encode_refuse(code, message))
                return
            conn.since = None  # accepted: its stream or transfer is never evicted
            first, _base = self.store.log_bounds()
            head = self.store.last_seq()  # a newest-only cache's stream starts right after
            upstream = (
                self.upstream is not None
                and hello.mode == frames.MODE_STREAM
                and bool(hello.options & frames.OPT_UPSTREAM)
            )
            await link.send(
                frames.encode_welcome(
                    frames.Welcome(
                        frames.PROTOCOL_VERSION,
                        self.node_id,
                        self._db_id,
                        head,
                        first,
                        self.heartbeat.interval_ms,
                        store_term(self.store) if hello.options & frames.OPT_TERM else None,
                    ),
                    frames.WELCOME_UPSTREAM if upstream else 0,
                ),
            )
            if hello.mode == frames.MODE_SNAPSHOT:
                await self._send_snapshot(hello, link, asked)
            elif hello.mode == frames.MODE_INVALIDATE:
                await invalidation.serve(self, hello, link, head)
            elif upstream and self.upstream is not None:
                origin = Origin(hello.client_id, peer, getattr(link, "peer_role", None))
                await self.upstream.serve_beside(link, origin, self._stream(hello, link, asked))
            else:
                await self._stream(hello, link, asked)
        except (ProtocolError, ValueError) as err:
            log.info("replica %s: %s", peer, err)
        except TimeoutError:
            log.warning(
                "replica %s: no complete HELLO within %gs or took nothing for %gs; closed",
                peer,
                self.hello_timeout,
                self.stall_timeout,
            )
        except (ConnectionError, OSError) as err:
            log.info("replica %s disconnected: %s", peer, err)
        except RuntimeError as err:
            # uvloop refuses a write to a transport the peer has closed with RuntimeError
            # ("the handler is closed"), not a ConnectionError: the same routine ending.
            if not link.closing():
                raise
            log.info("replica %s disconnected: %s", peer, err)
        except MercuryError as err:  # e.g. a corrupt log record: this stream cannot go on
            log.error("stream to replica %s stopped: %s", peer, err)
        except asyncio.CancelledError:
            pass

    def _refused(self, reason: str) -> None:
        REFUSED.inc(reason)
        self.on_refused(reason)

    def _refusal(self, hello: frames.Hello) -> tuple[int, str] | None:
        """The refusal for `hello`, or None to accept it (see `handshake.decide`)."""
        first, _ = self.store.log_bounds()
        return handshake.decide(
            hello,
            source_id=self.node_id,
            db_id=self._db_id,
            first_retained=first,
            closing=self._closing,
            diverged=self._diverged,
        )

    async def _keyspaces_asked(self, hello: frames.Hello, link: Link) -> frames.Keyspaces | None:
        """The KEYSPACES frame that follows a filtered replica's HELLO (None: a full one)."""
        if not hello.options & frames.OPT_KEYSPACES:
            return None
        ftype, _flags, body, _ok = await link.recv(self.hello_timeout, _KEYSPACES_FRAME)
        if ftype != frames.KEYSPACES:
            raise ProtocolError(f"expected KEYSPACES, got frame type {ftype}")
        asked = frames.decode_keyspaces(bytes(body))
        keyspace.normalize(asked.prefixes)  # ValueError: logged, the link closed
        return asked

    def _keyspace_refusal(self, asked: frames.Keyspaces | None) -> tuple[int, str] | None:
        why = keyspace.refusal(self.keyspaces, None if asked is None else asked.prefixes)
        return None if why is None else (frames.REFUSE_KEYSPACE, why)

    async def _stream(
        self, hello: frames.Hello, link: Link, asked: frames.Keyspaces | None = None
    ) -> None:
        # A filtered replica's records are filtered in a worker thread (`FilteredSession`).
        flt = None if asked is None else FilteredSession(asked, self.store.chain)
        pos = self.store.last_seq() + 1 if hello.newest_only else hello.last_seq + 1
        stop = hello.stop_seq or None
        ev = asyncio.Event()
        self._waiters[ev] = None
        held = not hello.options & frames.OPT_STANDBY
        if held:
            self._held[ev] = None
        interval = self.heartbeat.interval_ms / 1000
        # The loop's clock (a simulation's virtual one runs these streams too).
        clock = asyncio.get_running_loop().time
        last_hb_at = -interval
        last_hb: frames.Heartbeat | None = None
        heads = bool(hello.options & frames.OPT_HEADS)
        try:
            while True:
                ev.clear()
                if self._diverged is not None:
                    link.write(frames.encode_refuse(frames.REFUSE_DIVERGED, self._diverged))
                    await self._drain(link)
                    return
                # What was committed last is at hand (`_Tail`); older records are read
                # in a worker thread. A read that took everything the store held then
                # waits for `ev`, set by any later commit (it was cleared before).
                recs = None if flt is not None else self._tail.after(pos, self.store.last_seq())
                if recs is not None:
                    more = bool(recs) and len(recs) >= READ_RECORDS
                else:
                    try:
                        recs = await self.runtime.offload(
                            self.store.read_log, pos, max_records=READ_RECORDS, max_bytes=READ_BYTES
                        )
                    except LogRetentionError as err:
                        # GC overtook a slow client: it must bootstrap.
                        link.write(frames.encode_refuse(frames.REFUSE_BOOTSTRAP, str(err)))
                        await self._drain(link)
                        return
                    more = len(recs) >= READ_RECORDS or sum(len(r.payload) for r in recs) >= (
                        READ_BYTES
                    )
                if self.horizon is not None and held:
                    confirmed = self.horizon()
                    recs = [r for r in recs if r.last_seq <= confirmed]
                out = _Coalescer(link)
                encoded = None if flt is None else await self.runtime.offload(flt.frames_of, recs)
                for i, rec in enumerate(recs):
                    out.write(
                        frames.encode_record(rec.header, rec.payload)
                        if encoded is None
                        else encoded[i]
                    )
                    pos = rec.last_seq + 1
                    if stop is not None and rec.last_seq >= stop:
                        out.write(frames.encode_end(rec.last_seq))
                        out.flush()
                        await self._drain(link)
                        return
                out.flush()
                if recs:
                    await self._drain(link)
                now = clock()
                hb = self.heartbeat.current()
                due = now - last_hb_at >= interval
                newer = (
                    hb is not None
                    and self._relays
                    and (last_hb is None or hb.time_us > last_hb.time_us)
                )
                if hb is not None and (due or newer):
                    link.write(frames.encode_heartbeat(hb._replace(sent_seq=pos - 1), heads))
                    await self._drain(link)
                    last_hb, last_hb_at = hb, now
                elif hb is None:
                    # Nothing to say yet (a replica before its first upstream heartbeat,
                    # which wakes this stream when it comes): wait a whole interval. A
                    # heartbeat "due" since -interval made every wait below zero long, a
                    # busy loop of log reads until the first heartbeat came — for ever on
                    # a replica cut from its sources (found by `mercury sim`).
                    last_hb_at = now
                if recs and more:
                    continue  # more is there already; only a read that took all waits
                timeout = max(0.0, interval - (clock() - last_hb_at))
                # Caught up: the next commit's records are written from `_tail_arrived`
                # while this task sleeps (one turn of the loop sooner). Not for a stream
                # the horizon holds back, nor one that ends at `stop`.
                caught = None
                if stop is None and flt is None and not (held and self.horizon is not None):
                    caught = self._caught[ev] = _Caught(pos, link)
                try:
                    async with asyncio.timeout(timeout):  # no task per wait, unlike wait_for
                        await ev.wait()
                except TimeoutError:
                    pass
                finally:
                    if caught is not None:
                        del self._caught[ev]
                        pos = caught.pos
        finally:
            self._waiters.pop(ev, None)
            self._held.pop(ev, None)
            self._caught.pop(ev, None)
            if flt is not None:
                log.info(
                    "filtered stream to %s (keyspaces %s) ended: %d bytes sent for %d bytes "
                    "of records",
                    link.address,
                    describe(flt.prefixes),
                    flt.bytes_out,
                    flt.bytes_in,
                )

    async def _drain(self, link: Link) -> None:
        """Wait for the send buffer to drain; TimeoutError (the stream ends, the replica
        reconnects and resumes) when the replica takes nothing for the stall timeout."""
        await link.drain(self.stall_timeout)

    # --- bootstrap -------------------------------------------------------------------

    async def _send_snapshot(
        self, hello: frames.Hello, link: Link, asked: frames.Keyspaces | None = None
    ) -> None:
        token = object()
        peer = link.address
        self._queue.append(token)
        try:
            while True:
                try:
                    await asyncio.wait_for(self._slots.acquire(), 1.0)
                    break
                except TimeoutError:
                    pos = self._queue.index(token)
                    if pos == 0:
                        log.info(
                            "replica %s waits for a bootstrap slot; held by %s",
                            peer,
                            ", ".join(f"{p} ({n} bytes sent)" for p, n in self._holders.values())
                            or "nobody",
                        )
                    await link.send(frames.encode_wait(pos), self.stall_timeout)
        finally:
            self._queue.remove(token)
        self._holders[token] = (peer, 0)
        self.stats.active += 1
        self.stats.peak = max(self.stats.peak, self.stats.active)
        try:
            path, info = await self._snapshot_for(hello.snapshot_sha.hex())
            if asked is not None:  # a filtered replica's: derived for its prefixes
                path, info = await self._filtered_snapshot(path, info, asked.prefixes)
            offset = hello.snapshot_offset if hello.snapshot_sha.hex() == info.sha256 else 0
            offset = min(offset, info.size)
            self.stats.transfers.append((info.sha256, offset))
            offer = frames.SnapshotOffer(
                info.seq,
                bytes.fromhex(info.hash_head),
                self._db_id,
                info.size,
                bytes.fromhex(info.sha256),
                offset,
            )
            await link.send(frames.encode_snapshot(offer))

            def progress(n: int) -> None:
                self._holders[token] = (peer, n)

            try:
                sent = await link.send_file(
                    path,
                    offset,
                    info.size - offset,
                    stall_timeout=self.stall_timeout,
                    progress=progress,
                )
            except TimeoutError:
                self.stats.stalled += 1
                log.warning(
                    "bootstrap to %s stalled: no progress for %gs after %d of %d bytes; "
                    "closing it to free its slot",
                    peer,
                    self.stall_timeout,
                    self._holders[token][1],
                    info.size - offset,
                )
                link.abort()  # unsent bytes would hold the socket open
                return
            self.stats.bytes_sent += sent
            self.stats.served += 1
        finally:
            self._holders.pop(token, None)
            self.stats.active -= 1
            self._slots.release()

    async def _snapshot_for(self, resume_sha: str) -> tuple[str, snapshot.SnapshotInfo]:
        """A snapshot to send: the kept one when the client resumes it or it is recent and
        still followed by retained log; otherwise a new one."""
        async with self._snapshot_lock:
            first, _ = self.store.log_bounds()
            kept = self._snapshot
            if kept is not None:
                path, info, made = kept
                streamable = info.seq + 1 >= first and os.path.exists(path)
                fresh = self.runtime.monotonic() - made < SNAPSHOT_MAX_AGE
                if streamable and (info.sha256 == resume_sha or fresh):
                    return path, info
            os.makedirs(self._snapshot_dir, exist_ok=True)
            # (Deleting older ones below also deletes the filtered snapshots derived from
            # them, named after them: `prune.derived_path`.)
            path = os.path.join(self._snapshot_dir, f"snap-{time.time_ns()}.mdb")
            info = await self.runtime.offload(snapshot.make_snapshot, self.store, path)
            for old in glob.glob(os.path.join(self._snapshot_dir, "snap-*.mdb*")):
                if not old.startswith(path):
                    with contextlib.suppress(OSError):
                        os.unlink(old)  # an open transfer keeps its file until it ends
            self._snapshot = (path, info, self.runtime.monotonic())
            log.info("made snapshot at seq %d (%d bytes)", info.seq, info.size)
            return path, info

    async def _filtered_snapshot(
        self, path: str, info: snapshot.SnapshotInfo, prefixes: tuple[bytes, ...]
    ) -> tuple[str, snapshot.SnapshotInfo]:
        """The snapshot derived from the kept one at `path` for a filtered replica of
        `prefixes` (`store/prune.py`): made once per kept snapshot and prefix list, kept
        beside it (a resuming replica finds the same bytes), deleted with it."""
        keep = keyspace.normalize(prefixes)
        out = prune.derived_path(path, keep)
        async with self._snapshot_lock:
            if os.path.exists(out) and os.path.exists(snapshot.sidecar(out)):
                with open(snapshot.sidecar(out)) as f:
                    return out, snapshot.SnapshotInfo.from_json(f.read())
            derived = await self.runtime.offload(prune.filtered_snapshot, path, info, out, keep)
        log.info(
            "derived a snapshot for keyspaces %s at seq %d (%d of %d bytes)",
            describe(keep),
            derived.seq,
            derived.size,
            info.size,
        )
        return out, derived


class _Tail:
    """The records committed last, contiguous, at most `TAIL_BYTES` (but always the last
    one): a caught-up stream takes what it has not sent from here instead of reading."""

    __slots__ = ("bytes", "recs")

    def __init__(self) -> None:
        self.recs: collections.deque[LogRecord] = collections.deque()
        self.bytes = 0

    def clear(self) -> None:
        self.recs.clear()
        self.bytes = 0

    def extend(self, recs: list[LogRecord]) -> None:
        if self.recs and recs[0].first_seq != self.recs[-1].last_seq + 1:
            self.clear()  # not contiguous (cannot happen: commits arrive in order)
        for rec in recs:
            self.recs.append(rec)
            self.bytes += len(rec.payload)
        while len(self.recs) > 1 and self.bytes > TAIL_BYTES:
            self.bytes -= len(self.recs.popleft().payload)

    def after(self, pos: int, last_seq: int) -> list[LogRecord] | None:
        """Records from the one holding `pos` on (at most `READ_RECORDS`) when this tail
        holds them and is current (`last_seq`: the store's last seq; [] when `pos` is past
        it); None when the log must be read."""
        recs = self.recs
        if not recs or recs[-1].last_seq != last_seq or pos < recs[0].first_seq:
            return None
        if pos > last_seq:
            return []
        out = []
        for rec in reversed(recs):  # the wanted ones are the last few
            if rec.last_seq < pos:
                break
            out.append(rec)
        out.reverse()
        return out[:READ_RECORDS]


class _Caught:
    """A caught-up stream waiting for the next commit: where it is, and its link."""

    __slots__ = ("link", "pos")

    def __init__(self, pos: int, link: Link) -> None:
        self.pos = pos
        self.link = link

    def send(self, recs: list[LogRecord]) -> None:
        """Write the records of `recs` from `pos` on, when they continue it and the link
        takes what it gets (otherwise the stream's task sends them, with backpressure)."""
        link = self.link
        if link.closing() or link.backlog() >= _COALESCE:
            return
        todo = [r for r in recs if r.last_seq >= self.pos]
        if not todo or todo[0].first_seq > self.pos:
            return
        if sum(len(r.payload) for r in todo) > READ_BYTES:
            return  # a large commit is the task's, which drains as it writes
        out = _Coalescer(link)
        for rec in todo:
            out.write(frames.encode_record(rec.header, rec.payload))
            self.pos = rec.last_seq + 1
        out.flush()


class _Coalescer:
    """Joins small frames into writes of at least `_COALESCE` bytes (large ones go as they
    are, after what was pending): the frames keep their order."""

    __slots__ = ("link", "pending", "size")

    def __init__(self, link: Link) -> None:
        self.link = link
        self.pending: list[bytes] = []
        self.size = 0

    def write(self, frame: bytes) -> None:
        if len(frame) >= _COALESCE:
            self.flush()
            self.link.write(frame)
            return
        self.pending.append(frame)
        self.size += len(frame)
        if self.size >= _COALESCE:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.link.write(b"".join(self.pending))
            self.pending.clear()
            self.size = 0


_REFUSAL_REASONS = {
    frames.REFUSE_DB_ID: "db_id",
    frames.REFUSE_SELF: "self",
    frames.REFUSE_BOOTSTRAP: "bootstrap",
    frames.REFUSE_PROTOCOL: "protocol",
    frames.REFUSE_NOT_READY: "not_ready",
    frames.REFUSE_DIVERGED: "diverged",
    frames.REFUSE_KEYSPACE: "keyspace",
}


def _uuid_bytes(db_id: str) -> bytes:
    return uuid.UUID(db_id).bytes
