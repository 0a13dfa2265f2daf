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
import socket
import ssl
import threading
import time
import uuid
from asyncio import sslproto
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from core.errors import LogRetentionError, MercuryError, ProtocolError
from net.tlsconf import TlsContexts
from replicator import frames, handshake, notify, wire
from replicator.heartbeat import HeartbeatSource
from replicator.metrics import REFUSED
from replicator.terms import store_term
from replicator.upstream import Origin, UpstreamRouter
from store import snapshot
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
#: Bytes per sendfile call; each must go out within the stall timeout.
_STALL_BLOCK = 4 << 20
#: Connections served at once (streams, bootstraps and handshakes); more are closed at once.
MAX_CONNECTIONS = 256
#: A kept snapshot is reused for new bootstraps while younger than this.
SNAPSHOT_MAX_AGE = 300.0
_FILE_BLOCK = 1 << 20
#: A replica's first frame must be a HELLO (92 bytes): anything else closes at its header.
_FIRST_FRAME = frozenset({frames.HELLO})
#: StreamReader buffer of a TLS connection (asyncio's default for plaintext ones).
_STREAM_LIMIT = 1 << 16
#: Frames smaller than this are joined into one write of at least this size: one TLS
#: record run and one system call for many small log records instead of one each.
_COALESCE = 64 << 10
#: Bytes of recently committed records kept for streams that are caught up (see `_Tail`).
TAIL_BYTES = 4 << 20


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
    """Serves the log of `store` on `host:port` (port 0 picks a free one; see `port`)."""

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
        stall_timeout: float = STALL_TIMEOUT,
        hello_timeout: float = HELLO_TIMEOUT,
        tls: TlsContexts | None = None,
        upstream: UpstreamRouter | None = None,
    ) -> None:
        self.store = store
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
        self._waiters: set[asyncio.Event] = set()
        self._tail = _Tail()
        #: Streams waiting for the next commit, by their event: `_tail_arrived` sends them
        #: its records at once (see `_Caught`).
        self._caught: dict[asyncio.Event, _Caught] = {}
        self._tail_lock = threading.Lock()
        #: First seq the next commit's tail read starts at (None: resync at the next one).
        self._tail_next: int | None = None
        #: The streams `horizon` holds back (plain replicas of an HA leader): a standby's
        #: report moves the horizon and wakes these only.
        self._held: set[asyncio.Event] = set()
        self._conns: set[asyncio.Task[None]] = set()
        self._accepting: set[asyncio.Task[None]] = set()
        #: Every connection's own transport from the moment it is accepted until its
        #: handler ends: `stop` aborts the ones a handler never got to (accepted as the
        #: listener closed, their handler task not yet run).
        self._transports: set[asyncio.Transport] = set()
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake_listener: notify.WakeListener | None = None
        self._poll_task: asyncio.Task[None] | None = None
        self._closing = False
        #: The `REFUSE_DIVERGED` message once this node stopped as diverged (None: serving).
        self._diverged: str | None = None

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, hook commit notifications and start the safety poll."""
        self._loop = asyncio.get_running_loop()
        self.store.add_commit_listener(self._on_commit_threadsafe)
        self._wake_listener = notify.WakeListener(self.store.path, self.wake)
        self._wake_listener.start()
        if self.tls is None:
            self._server = await self._loop.create_server(
                lambda: _PlainAccept(self), self.host, self.port
            )
        else:
            self._server = await self._loop.create_server(
                lambda: _TlsAccept(self), self.host, self.port
            )
        self.port = self._server.sockets[0].getsockname()[1]
        self._poll_task = self._loop.create_task(self._poll())
        log.info("replication source listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        self._closing = True
        if self._server is not None:
            # asyncio's own loop makes a transport for an accepted socket one loop turn
            # after the accept, and drops the socket unclosed when the server was closed in
            # between (CPython gh-109564): stop accepting, let the turn run, then close.
            # (uvloop makes the transport at the accept; its `remove_reader` is a no-op.)
            for sock in self._server.sockets:
                asyncio.get_running_loop().remove_reader(sock.fileno())
            await asyncio.sleep(0)
            self._server.close()
        if self._wake_listener is not None:
            self._wake_listener.stop()
        pending = [*self._conns, *self._accepting]  # TLS ones may not have been admitted yet
        for t in [*pending, *([self._poll_task] if self._poll_task else [])]:
            t.cancel()
        for t in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for transport in self._transports:
            transport.abort()
        self._transports.clear()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

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
        if time.monotonic() - made < 2 * SNAPSHOT_MAX_AGE:
            return
        self._snapshot = None
        for p in (path, snapshot.sidecar(path)):
            with contextlib.suppress(OSError):
                os.unlink(p)
        log.info("deleted expired snapshot %s", path)

    # --- connections -----------------------------------------------------------------

    def _admit(self, peer: object) -> bool:
        """False (counted, logged) past the connection cap: every connection costs
        buffers and a task, so the ones over it are closed before anything is read.
        False (silently) once the source is stopping: a connection accepted as the
        listener closed must not be served by a source that has stopped."""
        if self._closing:
            return False
        if len(self._conns) < self.max_connections:
            return True
        self.refused_connections += 1
        self._refused("too_many")
        log.warning("refused replica %s: %d connections open (the cap)", peer, self.max_connections)
        return False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A plaintext connection (no `tls`)."""
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        if not self._admit(peer):
            self._transports.discard(writer.transport)
            await wire.close(writer)
            return
        self._conns.add(task)
        try:
            await self._serve(reader, writer, peer)
        finally:
            self._conns.discard(task)
            self._transports.discard(writer.transport)
            await wire.close(writer)

    async def _handle_tls(self, transport: asyncio.Transport, hs: _Handshake) -> None:
        """A connection to a TLS source: TLS was put on it when it was accepted."""
        task = asyncio.current_task()
        assert task is not None
        peer = transport.get_extra_info("peername")
        if not self._admit(peer):
            self._transports.discard(transport)
            transport.abort()
            return
        self._conns.add(task)
        try:
            pair = await self._start_tls(transport, hs, peer)
            if pair is None:
                return
            reader, writer = pair
            try:
                await self._serve(reader, writer, peer)
            finally:
                await wire.close(writer)
        except asyncio.CancelledError:
            transport.abort()
        finally:
            self._conns.discard(task)
            self._transports.discard(transport)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object
    ) -> None:
        """Handshake, then a stream or a snapshot transfer; every ending is logged."""
        try:
            ftype, body = await asyncio.wait_for(
                wire.read_frame(reader, _FIRST_FRAME), self.hello_timeout
            )
            if ftype != frames.HELLO:
                raise ProtocolError(f"expected HELLO, got frame type {ftype}")
            hello = frames.decode_hello(body)
            refusal = self._refusal(hello)
            if refusal is not None:
                code, message = refusal
                self._refused(_REFUSAL_REASONS.get(code, "protocol"))
                log.warning("refused replica %s: %s", peer, message)
                await wire.send(writer, frames.encode_refuse(code, message))
                return
            first, _base = self.store.log_bounds()
            upstream = (
                self.upstream is not None
                and hello.mode == frames.MODE_STREAM
                and bool(hello.options & frames.OPT_UPSTREAM)
            )
            await wire.send(
                writer,
                frames.encode_welcome(
                    frames.Welcome(
                        frames.PROTOCOL_VERSION,
                        self.node_id,
                        self._db_id,
                        self.store.last_seq(),
                        first,
                        self.heartbeat.interval_ms,
                        store_term(self.store) if hello.options & frames.OPT_TERM else None,
                    ),
                    frames.WELCOME_UPSTREAM if upstream else 0,
                ),
            )
            if hello.mode == frames.MODE_SNAPSHOT:
                await self._send_snapshot(hello, reader, writer)
            elif upstream and self.upstream is not None:
                origin = Origin(hello.client_id, str(peer))
                await self.upstream.serve_beside(
                    reader, origin, self._stream(hello, writer), writer
                )
            else:
                await self._stream(hello, writer)
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
            if not writer.transport.is_closing():
                raise
            log.info("replica %s disconnected: %s", peer, err)
        except MercuryError as err:  # e.g. a corrupt log record: this stream cannot go on
            log.error("stream to replica %s stopped: %s", peer, err)
        except asyncio.CancelledError:
            pass

    def _refused(self, reason: str) -> None:
        REFUSED.inc(reason)
        self.on_refused(reason)

    async def _start_tls(
        self, transport: asyncio.Transport, hs: _Handshake, peer: object
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """Wait for the TLS handshake (mutual: the peer's certificate must be signed by our
        CA); streams over it, or None (logged, counted, no frame sent) when it failed."""
        try:
            await asyncio.wait_for(asyncio.shield(hs.done), self.hello_timeout + 1)
        except TimeoutError:
            reason = "tls_timeout"
            detail = f"no TLS handshake within {self.hello_timeout:g}s"
        except ssl.SSLError as err:
            reason = tls_refusal_reason(err)
            detail = f"{err.reason or err}"
        except (ConnectionError, OSError) as err:
            # The TLS layer aborts a handshake past its timeout itself.
            timed_out = isinstance(err, ConnectionAbortedError) and "longer" in str(err)
            reason, detail = ("tls_timeout" if timed_out else "tls_failed"), str(err) or repr(err)
        else:
            tls_transport = hs.app.tls_transport
            assert tls_transport is not None
            loop = asyncio.get_running_loop()
            return hs.reader, asyncio.StreamWriter(tls_transport, hs.app, hs.reader, loop)
        self._refused(reason)
        log.warning("refused replica %s: TLS handshake failed (%s: %s)", peer, reason, detail)
        transport.abort()  # nothing to say to a peer we cannot trust
        return None

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

    async def _stream(self, hello: frames.Hello, writer: asyncio.StreamWriter) -> None:
        pos = self.store.last_seq() + 1 if hello.newest_only else hello.last_seq + 1
        stop = hello.stop_seq or None
        ev = asyncio.Event()
        self._waiters.add(ev)
        held = not hello.options & frames.OPT_STANDBY
        if held:
            self._held.add(ev)
        interval = self.heartbeat.interval_ms / 1000
        last_hb_at = 0.0
        last_hb: frames.Heartbeat | None = None
        heads = bool(hello.options & frames.OPT_HEADS)
        try:
            while True:
                ev.clear()
                if self._diverged is not None:
                    writer.write(frames.encode_refuse(frames.REFUSE_DIVERGED, self._diverged))
                    await self._drain(writer)
                    return
                # What was committed last is at hand (`_Tail`); older records are read
                # in a worker thread. A read that took everything the store held then
                # waits for `ev`, set by any later commit (it was cleared before).
                recs = self._tail.after(pos, self.store.last_seq())
                if recs is not None:
                    more = bool(recs) and len(recs) >= READ_RECORDS
                else:
                    try:
                        recs = await asyncio.to_thread(
                            self.store.read_log, pos, max_records=READ_RECORDS, max_bytes=READ_BYTES
                        )
                    except LogRetentionError as err:
                        # GC overtook a slow client: it must bootstrap.
                        writer.write(frames.encode_refuse(frames.REFUSE_BOOTSTRAP, str(err)))
                        await self._drain(writer)
                        return
                    more = len(recs) >= READ_RECORDS or sum(len(r.payload) for r in recs) >= (
                        READ_BYTES
                    )
                if self.horizon is not None and held:
                    confirmed = self.horizon()
                    recs = [r for r in recs if r.last_seq <= confirmed]
                out = _Coalescer(writer)
                for rec in recs:
                    out.write(frames.encode_record(rec.header, rec.payload))
                    pos = rec.last_seq + 1
                    if stop is not None and rec.last_seq >= stop:
                        out.write(frames.encode_end(rec.last_seq))
                        out.flush()
                        await self._drain(writer)
                        return
                out.flush()
                if recs:
                    await self._drain(writer)
                now = time.monotonic()
                hb = self.heartbeat.current()
                due = now - last_hb_at >= interval
                newer = (
                    hb is not None
                    and self._relays
                    and (last_hb is None or hb.time_us > last_hb.time_us)
                )
                if hb is not None and (due or newer):
                    writer.write(frames.encode_heartbeat(hb._replace(sent_seq=pos - 1), heads))
                    await self._drain(writer)
                    last_hb, last_hb_at = hb, now
                if recs and more:
                    continue  # more is there already; only a read that took all waits
                timeout = max(0.0, interval - (time.monotonic() - last_hb_at))
                # Caught up: the next commit's records are written from `_tail_arrived`
                # while this task sleeps (one turn of the loop sooner). Not for a stream
                # the horizon holds back, nor one that ends at `stop`.
                caught = None
                if stop is None and not (held and self.horizon is not None):
                    caught = self._caught[ev] = _Caught(pos, writer)
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
            self._waiters.discard(ev)
            self._held.discard(ev)
            self._caught.pop(ev, None)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait for the send buffer to drain; TimeoutError (the stream ends, the replica
        reconnects and resumes) when the replica takes nothing for the stall timeout."""
        async with asyncio.timeout(self.stall_timeout):
            await writer.drain()

    # --- bootstrap -------------------------------------------------------------------

    async def _send_snapshot(
        self, hello: frames.Hello, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        token = object()
        peer = writer.get_extra_info("peername")
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
                    await asyncio.wait_for(
                        wire.send(writer, frames.encode_wait(pos)), self.stall_timeout
                    )
        finally:
            self._queue.remove(token)
        self._holders[token] = (peer, 0)
        self.stats.active += 1
        self.stats.peak = max(self.stats.peak, self.stats.active)
        try:
            path, info = await self._snapshot_for(hello.snapshot_sha.hex())
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
            sock = writer.get_extra_info("socket")
            if sock is not None:  # a bulk transfer: let the kernel queue more of it
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            await wire.send(writer, frames.encode_snapshot(offer))

            def progress(n: int) -> None:
                self._holders[token] = (peer, n)

            try:
                sent = await send_file(
                    writer,
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
                writer.transport.abort()  # unsent bytes would hold the socket open
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
                fresh = time.monotonic() - made < SNAPSHOT_MAX_AGE
                if streamable and (info.sha256 == resume_sha or fresh):
                    return path, info
            os.makedirs(self._snapshot_dir, exist_ok=True)
            path = os.path.join(self._snapshot_dir, f"snap-{time.time_ns()}.mdb")
            info = await asyncio.to_thread(snapshot.make_snapshot, self.store, path)
            for old in glob.glob(os.path.join(self._snapshot_dir, "snap-*.mdb*")):
                if not old.startswith(path):
                    with contextlib.suppress(OSError):
                        os.unlink(old)  # an open transfer keeps its file until it ends
            self._snapshot = (path, info, time.monotonic())
            log.info("made snapshot at seq %d (%d bytes)", info.seq, info.size)
            return path, info


async def send_file(
    writer: asyncio.StreamWriter,
    path: str,
    offset: int,
    count: int,
    *,
    stall_timeout: float = STALL_TIMEOUT,
    progress: Callable[[int], None] = lambda _n: None,
) -> int:
    """Send `count` bytes of file `path` from `offset`: zero-copy sendfile where the loop
    has it (asyncio, plain TCP), else 1 MiB reads written with backpressure (uvloop, on
    the root; TLS).

    Sent in blocks, each of which must leave within `stall_timeout` seconds (TimeoutError
    otherwise: the peer stopped reading); `progress` gets the bytes sent after each block.
    """
    loop = asyncio.get_running_loop()
    done = 0
    # Over TLS the bytes must be encrypted in user space: no sendfile.
    tls = writer.get_extra_info("sslcontext") is not None
    with open(path, "rb") as f:
        try:
            if tls:
                raise asyncio.SendfileNotAvailableError("TLS transport")
            while done < count:
                n = min(_STALL_BLOCK, count - done)
                sent = await asyncio.wait_for(
                    loop.sendfile(writer.transport, f, offset + done, n, fallback=False),
                    stall_timeout,
                )
                done += int(sent)
                progress(done)
                if not sent:
                    break
            await asyncio.wait_for(writer.drain(), stall_timeout)
            return done
        except (NotImplementedError, asyncio.SendfileNotAvailableError):
            pass
        f.seek(offset + done)
        left = count - done
        while left:
            block = f.read(min(_FILE_BLOCK, left))
            if not block:
                break
            writer.write(block)
            await asyncio.wait_for(writer.drain(), stall_timeout)
            left -= len(block)
            progress(count - left)
        return count - left


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
    """A caught-up stream waiting for the next commit: where it is, and its writer."""

    __slots__ = ("pos", "writer")

    def __init__(self, pos: int, writer: asyncio.StreamWriter) -> None:
        self.pos = pos
        self.writer = writer

    def send(self, recs: list[LogRecord]) -> None:
        """Write the records of `recs` from `pos` on, when they continue it and the link
        takes what it gets (otherwise the stream's task sends them, with backpressure)."""
        transport = self.writer.transport
        if transport.is_closing() or transport.get_write_buffer_size() >= _COALESCE:
            return
        todo = [r for r in recs if r.last_seq >= self.pos]
        if not todo or todo[0].first_seq > self.pos:
            return
        if sum(len(r.payload) for r in todo) > READ_BYTES:
            return  # a large commit is the task's, which drains as it writes
        out = _Coalescer(self.writer)
        for rec in todo:
            out.write(frames.encode_record(rec.header, rec.payload))
            self.pos = rec.last_seq + 1
        out.flush()


class _Coalescer:
    """Joins small frames into writes of at least `_COALESCE` bytes (large ones go as they
    are, after what was pending): the frames keep their order."""

    __slots__ = ("pending", "size", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: list[bytes] = []
        self.size = 0

    def write(self, frame: bytes) -> None:
        if len(frame) >= _COALESCE:
            self.flush()
            self.writer.write(frame)
            return
        self.pending.append(frame)
        self.size += len(frame)
        if self.size >= _COALESCE:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writer.write(b"".join(self.pending))
            self.pending.clear()
            self.size = 0


class _PlainAccept(asyncio.StreamReaderProtocol):
    """A plaintext connection: `asyncio.start_server`'s protocol, which also registers the
    transport with the source the moment it is accepted (see `ReplicationSource.stop`)."""

    def __init__(self, source: ReplicationSource) -> None:
        super().__init__(asyncio.StreamReader(limit=_STREAM_LIMIT), source._handle)
        self.source = source

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        self.source._transports.add(cast(asyncio.Transport, transport))
        super().connection_made(transport)


class _TlsAccept(asyncio.Protocol):
    """Puts TLS on a new connection before anything is read from it.

    The TLS layer is installed in `connection_made`, synchronously: uvloop starts reading
    right after that call (a `pause_reading` there does not hold), so a later
    `loop.start_tls` could lose the peer's ClientHello to this protocol and the handshake
    would hang. `asyncio.sslproto.SSLProtocol` runs on uvloop's transports as on asyncio's.
    """

    def __init__(self, source: ReplicationSource) -> None:
        self.source = source

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert self.source.tls is not None
        loop = asyncio.get_running_loop()
        # A stream transport (uvloop's are not asyncio.Transport subclasses).
        stream = cast(asyncio.Transport, transport)
        reader = asyncio.StreamReader(limit=_STREAM_LIMIT)
        app = _TlsStream(reader)
        waiter: asyncio.Future[None] = loop.create_future()
        layer = sslproto.SSLProtocol(
            loop,
            app,
            self.source.tls.server,
            waiter,
            server_side=True,
            # A float works (asyncio compares it to elapsed seconds); the stub says int.
            ssl_handshake_timeout=self.source.hello_timeout,  # type: ignore[arg-type]
        )
        self.source._transports.add(stream)
        stream.set_protocol(layer)
        layer.connection_made(stream)
        task = loop.create_task(self.source._handle_tls(stream, _Handshake(reader, app, waiter)))
        self.source._accepting.add(task)  # a reference until it runs (then `_conns` holds it)
        task.add_done_callback(self.source._accepting.discard)


class _TlsStream(asyncio.StreamReaderProtocol):
    """The stream protocol under TLS; remembers the TLS transport it is given."""

    tls_transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tls_transport = cast(asyncio.Transport, transport)
        super().connection_made(transport)


@dataclass
class _Handshake:
    """A TLS handshake under way: its stream ends and the future it completes."""

    reader: asyncio.StreamReader
    app: _TlsStream
    done: asyncio.Future[None]


_REFUSAL_REASONS = {
    frames.REFUSE_DB_ID: "db_id",
    frames.REFUSE_SELF: "self",
    frames.REFUSE_BOOTSTRAP: "bootstrap",
    frames.REFUSE_PROTOCOL: "protocol",
    frames.REFUSE_NOT_READY: "not_ready",
    frames.REFUSE_DIVERGED: "diverged",
}

#: OpenSSL's reasons for a server-side handshake failure, by what the peer did.
_PLAINTEXT = frozenset(
    {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
     "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNEXPECTED_RECORD"}
)  # fmt: skip
_NO_CERT = frozenset({"PEER_DID_NOT_RETURN_A_CERTIFICATE", "NO_CERTIFICATE_RETURNED"})


def tls_refusal_reason(err: ssl.SSLError) -> str:
    """The `mercury_repl_refused_total` reason for a failed server-side handshake."""
    if isinstance(err, ssl.SSLCertVerificationError):
        return "untrusted_certificate"
    reason = err.reason or ""
    if reason in _PLAINTEXT:
        return "plaintext"
    if reason in _NO_CERT:
        return "no_certificate"
    if "CERTIFICATE" in reason or "UNKNOWN_CA" in reason:
        return "untrusted_certificate"
    return "tls_failed"


def _uuid_bytes(db_id: str) -> bytes:
    return uuid.UUID(db_id).bytes
