"""The replica's replication client: connect to a source, handshake, apply the stream.

Contract:

- Streams from the store's last applied seq + 1 (after a restart: no replay, no skip).
- Each RECORD is checked for continuity before it is applied (a record not starting right
  after the last applied seq is a gap or a repeat: StreamGapError, nothing applied) and
  applied by `Store.apply_log_records`, which checks the CRC, the entries (every one a
  store accepts, else `InvalidRecordError`) and the hash chain of each;
  records already queued behind one another are applied in one transaction (a replica
  catching up pays one commit per group). Applies run in one worker thread so the event
  loop — which also serves this node's downstream replicas — never stalls on a commit.
- A broken stream (bad frame, gap, repeat, cut) is logged with what was expected and what
  came, counted, and the client reconnects and resumes from the last applied seq.
- Terminal states (the worker stops retrying; reads keep being served):
  `diverged` when the source's history differs from this replica's at the same seq — a
  record continuing from our last seq whose hash chain does not hold, or a repeated record
  whose hash (or boundaries) differ from our own log's; the error names both hashes and
  the way out (re-bootstrap) — or when a root heartbeat reports a head below our seq long
  after the root committed our last record (the root lost history and has not reached our
  seq again yet), or when a head-aware root heartbeat (`frames.OPT_HEADS`) names a hash
  head at a seq this replica holds that is not its own there (`replicator/divergence.py`:
  a restored root that reached exactly this replica's seq again with other writes), or
  when its source refuses it as diverged (`frames.REFUSE_DIVERGED`) naming a point of the
  abandoned history that this replica holds too. A diverged replica's `ReplicationFailed`
  carries such a point (`abandoned`) for its own source to refuse downstream replicas with.
  `failed` when a record holds entries no store accepts (`InvalidRecordError`).
- Ordered sources with a staleness rule (no new record nor new root heartbeat for
  `staleness` seconds: move to the next source) and bounded backoff (`selection.py`).
- `BootstrapNeededError` (source lost the history) ends `run()`: the caller bootstraps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from core.errors import (
    BootstrapNeededError,
    ChainError,
    CorruptionError,
    DbIdMismatchError,
    DivergedError,
    InvalidRecordError,
    LogRetentionError,
    MercuryError,
    ProtocolError,
    RefusedError,
    SelfReplicationError,
    StreamGapError,
)
from core.tasks import cancelling
from net.tlsconf import TlsContexts
from replicator import frames, upstream, wire
from replicator.divergence import Point, RecentPoints, heartbeat_shows_divergence, holds
from replicator.heartbeat import RelayedHeartbeat
from replicator.pacing import CommitPacer
from replicator.runtime import PROCESS, Runtime
from replicator.selection import Selector
from replicator.status import StatusBoard
from replicator.tcp import TcpTransport
from replicator.terms import source_too_old, store_term
from replicator.transport import Link, Transport
from store.ops import LogRecord
from store.store import Store

log = logging.getLogger("mercury.replication.client")

CONNECT_TIMEOUT = 5.0
#: How long a probe of a preferred source may take to show a fresh heartbeat.
PROBE_TIMEOUT = 3.0
#: Batches read ahead while one is being applied.
PIPELINE = 32
#: Bounds of one group of queued records applied in one transaction.
GROUP_RECORDS = PIPELINE
GROUP_BYTES = 32 << 20
#: A group this large commits at once, without waiting out the apply window: the
#: commit's fixed cost is already small beside what it applies.
WINDOW_BYTES = 1 << 20
#: Default apply window of a replica (seconds; off): see `ReplicaClient`. Fewer, larger
#: commits cost less CPU when a root sends many small records, but each holds the core
#: longer, in the kernel too, and a read on that core waits for it (docs/replication.md).
APPLY_WINDOW = 0.0
#: A root heartbeat this much newer than the commit of the replica's last record, with a
#: lower head seq, means the root lost history (restored from an older copy): its head
#: must otherwise include that record. The margin covers the time between a batch's
#: timestamp and its commit by far.
ROLLBACK_MARGIN = 60.0
#: Stream buffer: a whole large log record fits, so reading never stops mid-record.
READ_LIMIT = 16 << 20


class ReplicationFailed(Exception):
    """Replication cannot continue without an operator (diverged history, invalid record).

    `abandoned`: for a diverged history, (seq, hash head) of a point of it this node holds
    (its source refuses replicas with it: `ReplicationSource.stop_as_diverged`); else None.
    """

    def __init__(self, message: str, *, abandoned: tuple[int, bytes] | None = None) -> None:
        super().__init__(message)
        self.abandoned = abandoned


#: What the operator does about a diverged replica (also in docs/operations.md).
REBOOTSTRAP_HINT = (
    "re-bootstrap this replica: stop it, `rm -r DATA_DIR`, start it again (it fetches a "
    "snapshot of its source)"
)


def diverged_error(seq: int, ours: str, theirs: str) -> DivergedError:
    """The named error of a diverged history: what this replica and the source hold."""
    return DivergedError(
        f"diverged history at seq {seq}: this replica holds {ours}, the source holds "
        f"{theirs} (the source was restored from an older copy or is another history)",
        seq=seq,
        hint=REBOOTSTRAP_HINT,
    )


def discontinuity(received: int, first_seq: int) -> str | None:
    """ "gap" or "repeat" when a record starting at `first_seq` does not continue a stream
    received up to seq `received`; None when it does. (Its own function: the simulator's
    mutation check replaces it to show that a skipped check is caught, `tests/sim`.)"""
    if first_seq == received + 1:
        return None
    return "repeat" if first_seq <= received else "gap"


def _describe(rec: LogRecord) -> str:
    return f"seq {rec.first_seq}..{rec.last_seq} with hash head {rec.hash_head.hex()}"


def refusal_error(r: frames.Refuse) -> RefusedError:
    """The named error for a source's refusal."""
    cls: type[RefusedError] = {
        frames.REFUSE_DB_ID: DbIdMismatchError,
        frames.REFUSE_SELF: SelfReplicationError,
        frames.REFUSE_BOOTSTRAP: BootstrapNeededError,
    }.get(r.code, RefusedError)
    return cls(f"source refused: {r.message}", code=r.code)


def check_welcome(welcome: frames.Welcome, db_id: bytes) -> None:
    """Refuse a source that welcomed us with another store's db id (a source checks ours
    too, but a replica never trusts the other end to have done so)."""
    if welcome.db_id != db_id:
        raise DbIdMismatchError(
            f"source holds db {uuid.UUID(bytes=welcome.db_id)}, this replica holds "
            f"{uuid.UUID(bytes=db_id)}; not following it"
        )


class ReplicaClient:
    """Keeps `store` following the first healthy of `selector.sources`, over `transport`
    (None: TCP, with mutual TLS when `tls`)."""

    def __init__(
        self,
        store: Store,
        selector: Selector,
        *,
        node_id: bytes,
        board: StatusBoard,
        relay: RelayedHeartbeat,
        staleness: float = 30.0,
        failback: float = 30.0,
        tls: TlsContexts | None = None,
        outbox: upstream.UpstreamOutbox | None = None,
        apply_window: float = 0.0,
        transport: Transport | None = None,
        keyspaces: tuple[bytes, ...] | None = None,
        runtime: Runtime = PROCESS,
    ) -> None:
        self.store = store
        #: The prefixes this replica holds (None: every key): it asks its sources for a
        #: filtered stream (`frames.KEYSPACES`, `store/filtered.py`).
        self.keyspaces = keyspaces
        self.transport: Transport = transport or TcpTransport(tls)
        #: Its clock and where applies run: an apply thread, or inline on the loop in a
        #: simulation (`replicator/runtime.py`).
        self.runtime = runtime
        #: While the stream is heavy, the least time between the starts of two commits of
        #: the apply thread (seconds; 0: commit what is queued at once): records arriving
        #: meanwhile join one group, up to WINDOW_BYTES (`pacing.CommitPacer`). A light
        #: stream is committed at once. A standby whose commit acknowledges the leader's
        #: writes waits 0.
        self.apply_window = apply_window
        #: Frames for the source (sent only to a source that accepts them; None: none).
        self.outbox = outbox
        #: Mutual TLS to every source (None: plaintext).
        self.tls = tls
        self.failback = failback
        self.selector = selector
        self.node_id = node_id
        self.board = board
        self.relay = relay
        self.staleness = staleness
        self._db_id = bytes.fromhex(store.db_id.replace("-", ""))
        seq, _ = store.head()
        self.applied = seq
        self._applied_us = 0
        #: Points of the records applied lately, for heartbeat heads (`divergence.py`).
        self._points = RecentPoints()
        #: A point of this node's history shown abandoned, once one is (see `run`).
        self.abandoned: tuple[int, bytes] | None = None
        #: The source of the current session ("host:port"), for messages.
        self._source = ""
        #: The seq last looked up in the log and what was found (one read per seq:
        #: heartbeats repeat it).
        self._looked_up: tuple[int, Point | None] = (-1, None)
        board.update(applied_seq=seq)

    async def run(self) -> None:
        """Replicate until cancelled. Raises BootstrapNeededError (bootstrap, then call
        again) and ReplicationFailed (diverged history)."""
        try:
            while True:
                host, port = self.selector.current
                name = f"{host}:{port}"
                try:
                    await self._session(host, port)
                    wait = self.selector.retry_same()
                except BootstrapNeededError:
                    raise
                except _Failback as fb:
                    log.info(
                        "returning to preferred source %s:%d", *self.selector.sources[fb.index]
                    )
                    self.selector.index = fb.index
                    wait = 0.0
                except RefusedError as err:
                    log.error("source %s: %s", name, err)
                    self.board.count_error("refused", f"{name}: {err}")
                    wait = self.selector.failed()
                except _OlderTerm as err:
                    log.warning("source %s: %s; moving to the next source", name, err)
                    self.board.count_error("older_term", f"{name}: {err}")
                    wait = self.selector.failed()
                except _Stale:
                    msg = f"source {name} stale: nothing new for {self.staleness:g}s"
                    log.warning("%s; moving to the next source", msg)
                    self.board.count_error("stale", msg)
                    wait = self.selector.stale()
                except (StreamGapError, ProtocolError, CorruptionError) as err:
                    if isinstance(err, ChainError):
                        raise  # gaps are caught before apply: terminal below
                    log.warning(
                        "stream from %s broken: %s; resuming at seq %d", name, err, self.applied + 1
                    )
                    self.board.count_error(type(err).__name__, f"{name}: {err}")
                    wait = self.selector.retry_same()
                except (OSError, TimeoutError) as err:
                    log.info("source %s unreachable: %s", name, err)
                    self.board.count_error("unreachable", f"{name}: {err}")
                    wait = self.selector.failed()
                if cancelling():  # asked to stop while an error path swallowed it
                    raise asyncio.CancelledError
                self.board.update(state="reconnecting")
                if wait:
                    await asyncio.sleep(wait)
        except (DivergedError, ChainError) as err:
            log.error("replication stopped: %s", err)
            self.board.update(state="diverged", error=str(err))
            # The head is on the abandoned history whatever showed it (a lower point, when
            # one is known, also catches replicas further behind).
            abandoned = self.abandoned or self.store.head()
            raise ReplicationFailed(str(err), abandoned=abandoned) from err
        except InvalidRecordError as err:
            log.error("replication stopped: %s", err)
            self.board.count_error("invalid_record", str(err))
            self.board.update(state="failed", error=str(err))
            raise ReplicationFailed(str(err)) from err

    def _hello(self, options: int) -> bytes:
        """The HELLO frame asking to stream from the seq after ours (`options`: flags),
        then a filtered replica's KEYSPACES frame (its head at that seq, its prefixes)."""
        keyspaces = b""
        if self.keyspaces is not None:
            options |= frames.OPT_KEYSPACES
            _seq, head = self.store.head()
            keyspaces = frames.encode_keyspaces(frames.Keyspaces(head, self.keyspaces))
        hello = frames.encode_hello(
            frames.Hello(
                frames.PROTOCOL_VERSION,
                frames.MODE_STREAM,
                options,
                self.node_id,
                self._db_id,
                self.applied,
                0,
                0,
                frames.ZERO_SHA,
            )
        )
        return hello + keyspaces

    async def _session(self, host: str, port: int) -> None:
        self._source = f"{host}:{port}"
        self.board.update(state="connecting", source=self._source)
        self.applied = self.store.last_seq()
        self._applied_us = self._commit_time_us(self.applied)
        link = await self.transport.connect(host, port, timeout=CONNECT_TIMEOUT)
        try:
            opts = frames.OPT_TERM | frames.OPT_HEADS
            opts |= frames.OPT_UPSTREAM if self.outbox is not None else 0
            await link.send(self._hello(opts))
            ftype, flags, body, _ = await link.recv(CONNECT_TIMEOUT)
            body = bytes(body)
            if ftype == frames.REFUSE:
                raise self._refusal(frames.decode_refuse(body))
            if ftype != frames.WELCOME:
                raise ProtocolError(f"expected WELCOME, got frame type {ftype}")
            welcome = frames.decode_welcome(body)
            check_welcome(welcome, self._db_id)
            own = store_term(self.store)
            if source_too_old(welcome.term, own):
                raise _OlderTerm(
                    f"it holds leadership term {welcome.term}, this replica already applied "
                    f"term {own} (a deposed leader, or a node following one)"
                )
            self.selector.connected()
            self.board.update(state="streaming", error=None)
            log.info("streaming from %s:%d at seq %d", host, port, self.applied + 1)
            probe = None
            if self.selector.index > 0 and self.failback > 0:
                probe = asyncio.ensure_future(self._probe_preferred(link))
            pump = upstream.pump_while(self.outbox, flags, link)
            try:
                await self._stream(link)
            finally:
                if pump is not None:
                    pump.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await pump
                if probe is not None:
                    probe.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await probe
                    back = probe.result() if probe.done() and not probe.cancelled() else None
                    if back is not None:
                        raise _Failback(back)
        finally:
            await link.close()

    async def _probe_preferred(self, link: Link) -> int:
        """While streaming from a fallback source, every `failback` seconds check the
        sources listed before it; when one is healthy — it accepts us, is at least as far
        along, and relays a fresh root heartbeat — end the session to move back to it."""
        while True:
            await asyncio.sleep(self.failback)
            for i in range(self.selector.index):
                host, port = self.selector.sources[i]
                with contextlib.suppress(OSError, TimeoutError, ProtocolError, ValueError):
                    if await self._healthy(host, port):
                        link.end_reading()  # _session then raises _Failback
                        return i

    async def _healthy(self, host: str, port: int) -> bool:
        link = await self.transport.connect(host, port, timeout=CONNECT_TIMEOUT)
        try:
            await link.send(self._hello(frames.OPT_NEWEST_ONLY | frames.OPT_TERM))
            async with asyncio.timeout(PROBE_TIMEOUT):
                ftype, _, body, _ = await link.recv()
                if ftype != frames.WELCOME:
                    return False
                welcome = frames.decode_welcome(bytes(body))
                if welcome.db_id != self._db_id or welcome.head_seq < self.applied:
                    return False
                if source_too_old(welcome.term, store_term(self.store)):
                    return False
                while True:
                    ftype, _, body, _ = await link.recv()
                    if ftype == frames.HEARTBEAT:
                        hb = frames.decode_heartbeat(bytes(body))
                        # The root's wall clock against ours: a heartbeat's time is wall time.
                        age_us = self.runtime.now_us() - hb.time_us
                        return age_us <= hb.interval_ms * 1000 + 1_000_000
        finally:
            await link.close()

    async def _stream(self, link: Link) -> None:
        """Read frames and apply them in a pipeline: while one batch commits in the apply
        thread, the loop already reads and checks the next ones (bounded read-ahead: over
        TCP, frames are received straight into their buffers, no stream buffer copies)."""
        link.read_ahead(READ_LIMIT)
        kind = _ApplyThread if self.runtime.threads else _ApplyInline
        applier = kind(
            self.store,
            asyncio.get_running_loop(),
            self._applied,
            self._heartbeat,
            _EndReading(link),
            self._counted,
            self.apply_window,
        )
        failure: BaseException | None = None
        try:
            await self._read_loop(link, applier)
        except BaseException as err:  # re-raised below, after the applier has settled
            failure = err
        if isinstance(failure, asyncio.CancelledError):
            applier.drop_pending()  # stopping: the next session streams them again
        # Any other failure (a gap, a repeat, a broken or lost connection, staleness) is
        # seen on a frame *after* the queued records, which arrived whole and contiguous
        # and are checked again by the store: apply them. Dropping them livelocks a replica
        # whose link breaks at the same point of every burst (a proxy cutting every few
        # frames): each new session starts from the same seq. A standby that applies the
        # last records of a leader that just died holds an unacknowledged tail at worst,
        # which the next leader's history probe finds and moves aside (ha_standby).
        # Never abandon an apply in flight: `applied` must match the store.
        error = await applier.finish()
        if error is not None:
            raise error from failure
        if failure is not None:
            raise failure

    def _commit_time_us(self, seq: int) -> int:
        """The root's timestamp of the record holding `seq` (0: unknown or collected)."""
        if seq <= 0:
            return 0
        with contextlib.suppress(LogRetentionError):
            recs = self.store.read_log(seq, max_records=1)
            if recs and recs[0].first_seq <= seq <= recs[0].last_seq:
                return recs[0].time_us
        return 0

    def _check_not_rolled_back(self, hb: frames.Heartbeat) -> None:
        """Raise DivergedError when the root's heartbeat shows a head below this replica's
        seq well after the root committed it (see ROLLBACK_MARGIN)."""
        if (
            hb.seq < self.applied
            and self._applied_us
            and hb.time_us > self._applied_us + int(ROLLBACK_MARGIN * 1e6)
        ):
            seq, head = self.store.head()
            raise DivergedError(
                f"diverged history: this replica holds seq {seq} (hash head {head.hex()}), "
                f"committed by the root {(hb.time_us - self._applied_us) / 1e6:.0f}s before "
                f"the root reported its head at seq {hb.seq}: the root lost history "
                "(restored from an older copy?)",
                seq=seq,
                hint=REBOOTSTRAP_HINT,
            )

    def _applied(self, rec: LogRecord) -> None:
        self.applied = rec.last_seq
        self._applied_us = rec.time_us
        self._points.add(Point(rec.last_seq, rec.hash_head, rec.time_us))
        st = self.board.status
        self.board.update(applied_seq=rec.last_seq, known_us=max(st.known_us, rec.time_us))

    def _counted(self, group: list[LogRecord], commits: int, seconds: float) -> None:
        """Count an applied group for the applier's metrics (`replicator/metrics.py`)."""
        st = self.board.status
        self.board.update(
            applied_records=st.applied_records + len(group),
            applied_bytes=st.applied_bytes + sum(len(r.header) + len(r.payload) for r in group),
            apply_commits=st.apply_commits + commits,
            apply_seconds=st.apply_seconds + seconds,
        )

    def _heartbeat(self, hb: frames.Heartbeat) -> None:
        st = self.board.status
        known = max(st.known_us, hb.time_us) if self.applied >= hb.seq else st.known_us
        self.board.update(
            hb_time_us=hb.time_us, hb_seq=hb.seq, hb_interval_ms=hb.interval_ms, known_us=known
        )

    async def _read_loop(self, link: Link, applier: _ApplyThread | _ApplyInline) -> None:
        # The loop's clock (a simulation's virtual one runs these sessions too).
        clock = asyncio.get_running_loop().time
        received = self.applied
        fresh_at = clock()
        while True:
            left = self.staleness - (clock() - fresh_at)
            if left <= 0:
                raise _Stale()
            try:
                ftype, _, body, record_ok = await link.recv(left)
            except TimeoutError:
                raise _Stale() from None
            if ftype == frames.RECORD:
                rec = wire.parse_record_view(body)
                kind = discontinuity(received, rec.first_seq)
                if kind is not None:
                    if rec.first_seq <= self.applied:
                        self._check_same_history(rec)
                    raise StreamGapError(
                        f"seq {kind}: expected a record starting at seq {received + 1}, "
                        f"got one starting at {rec.first_seq}",
                        seq=received,
                    )
                received = rec.last_seq
                fresh_at = clock()
                self.selector.progressed()
                await applier.put(rec, crc_checked=record_ok)
            elif ftype == frames.HEARTBEAT:
                hb = frames.decode_heartbeat(bytes(body))
                self._check_head(hb)
                self._check_not_rolled_back(hb)
                if hb.sent_seq > received:
                    raise StreamGapError(
                        f"seq gap: the source sent up to seq {hb.sent_seq}, this replica "
                        f"received only up to {received}",
                        seq=received,
                    )
                if self.relay.update(hb):  # relayed downstream at once
                    fresh_at = clock()
                    self.selector.progressed()
                await applier.put(hb)
            elif ftype == frames.REFUSE:
                raise self._refusal(frames.decode_refuse(bytes(body)))
            elif ftype == frames.END:
                return
            else:
                raise ProtocolError(f"unexpected frame type {ftype} in a stream")

    def _own_point(self, seq: int) -> Point | None:
        """This node's record holding `seq` (its end, head and commit time): remembered,
        else its head when `seq` is its head seq, else read from the log (once per seq:
        heartbeats repeat it); None when the log no longer holds it."""
        point = self._points.get(seq)
        if point is not None:
            return point
        head_seq, head = self.store.head()
        if seq == head_seq:
            return Point(seq, head, self._applied_us if seq == self.applied else 0)
        if seq == self._looked_up[0]:
            return self._looked_up[1]
        found = None
        with contextlib.suppress(LogRetentionError):
            recs = self.store.read_log(seq, max_records=1)
            if recs and recs[0].first_seq <= seq <= recs[0].last_seq:
                rec = recs[0]
                found = Point(rec.last_seq, rec.hash_head, rec.time_us)
        self._looked_up = (seq, found)
        return found

    def _check_head(self, hb: frames.Heartbeat) -> None:
        """Raise DivergedError when the root's hash head in `hb` (a head-aware heartbeat)
        is not this replica's own at the root's seq (`divergence.py`). Only a seq this
        replica has applied can be compared; a higher one is checked by the hash chain of
        the records that bring it there."""
        if hb.head is None or hb.seq <= 0 or hb.seq > self.applied:
            return
        own = self._own_point(hb.seq)
        if own is None or not heartbeat_shows_divergence(hb.seq, hb.head, hb.time_us, own):
            return
        self.abandoned = (own.last_seq, own.head)
        seq, head = self.store.head()
        where = (
            f"at seq {hb.seq}"
            if own.last_seq == hb.seq
            else f"in a record ending at seq {own.last_seq} (the root's ends at {hb.seq})"
        )
        raise diverged_error(
            hb.seq,
            f"hash head {own.head.hex()} {where} (its head: seq {seq}, hash head {head.hex()})",
            f"hash head {hb.head.hex()} at seq {hb.seq} (the root's heartbeat)",
        )

    def _refusal(self, r: frames.Refuse) -> Exception:
        """The error for a source's refusal: DivergedError when the source stopped as
        diverged naming a point of its abandoned history that this replica holds too (it
        followed that history, and no other source can continue it); else `refusal_error`
        (a replica that does not hold the point may be behind where the histories part:
        it tries its next source)."""
        evidence = frames.diverged_evidence(r.message) if r.code == frames.REFUSE_DIVERGED else None
        if evidence is None:
            return refusal_error(r)
        seq, head = evidence
        if seq > self.store.last_seq() or not holds(self._own_point(seq), seq, head):
            return refusal_error(r)
        self.abandoned = evidence
        return DivergedError(
            f"diverged history at seq {seq}: this replica holds hash head {head.hex()} there, "
            f"a history its source {self._source} stopped on as diverged (the root does not "
            f"hold it): {r.message}",
            seq=seq,
            hint=REBOOTSTRAP_HINT,
        )

    def _check_same_history(self, rec: LogRecord) -> None:
        """Raise DivergedError when `rec`, a record this replica already applied a version
        of, is not byte-for-byte its own (a log is shipped byte-identical, so the same
        history has the same record boundaries and hash heads)."""
        try:
            local = self.store.read_log(rec.first_seq, max_records=1)
        except LogRetentionError:
            return  # collected here: nothing to compare with, a plain repeat
        if not local:
            return
        mine = local[0]
        if (mine.first_seq, mine.num_entries, mine.hash_head) != (
            rec.first_seq,
            rec.num_entries,
            rec.hash_head,
        ):
            self.abandoned = (mine.last_seq, mine.hash_head)
            raise diverged_error(rec.first_seq, _describe(mine), _describe(rec))


class _OlderTerm(Exception):
    """The source holds an older leadership term than this replica (`replicator/terms.py`)."""


class _Failback(Exception):
    """A preferred source is healthy again: move back to it."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.index = index


class _Stale(Exception):
    """No new record nor new heartbeat for the staleness period."""


class _Reader(Protocol):
    """What the apply thread ends when it fails: the session's reading."""

    def feed_eof(self) -> None: ...


class _EndReading:
    """A link's `end_reading` as the apply thread calls it."""

    __slots__ = ("link",)

    def __init__(self, link: Link) -> None:
        self.link = link

    def feed_eof(self) -> None:
        self.link.end_reading()


class _ApplyThread:
    """Applies a session's records in order in its own thread.

    The loop hands records (and heartbeats, to keep their order) over a thread-safe queue
    bounded by `PIPELINE`; the thread applies them back to back — no loop round trip between
    two applies — and reports each one to the loop with `call_soon_threadsafe`. On an apply
    error the thread stops and wakes the reader (`feed_eof`), so the session ends with it.
    """

    def __init__(
        self,
        store: Store,
        loop: asyncio.AbstractEventLoop,
        on_applied: Callable[[LogRecord], None],
        on_heartbeat: Callable[[frames.Heartbeat], None],
        reader: _Reader,
        on_group: Callable[[list[LogRecord], int, float], None],
        window: float = 0.0,
    ) -> None:
        self._store = store
        self._window = window
        self._loop = loop
        self._on_applied = on_applied
        self._on_group = on_group
        self._on_heartbeat = on_heartbeat
        self._reader = reader
        self._q: queue.SimpleQueue[LogRecord | frames.Heartbeat | None] = queue.SimpleQueue()
        #: The first seqs of queued records whose log CRC the frame reader already checked.
        self._checked: set[int] = set()
        self._space = asyncio.Semaphore(PIPELINE)
        self._done: asyncio.Future[None] = loop.create_future()
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="apply", daemon=True).start()

    async def put(self, item: LogRecord | frames.Heartbeat, crc_checked: bool = False) -> None:
        """Queue `item`, waiting while PIPELINE items are already queued. `crc_checked`:
        the log record's CRC holds (the store need not check it again). Raises the
        thread's error once it has stopped: nothing would ever make room again."""
        self._raise_if_stopped()
        await self._space.acquire()
        self._raise_if_stopped()
        if crc_checked and isinstance(item, LogRecord):
            self._checked.add(item.first_seq)
        self._q.put(item)

    def _raise_if_stopped(self) -> None:
        # The session ends with the thread's error; a clean stop without one is a broken
        # stream: the client reconnects and a new session starts a new thread.
        if self._done.done():
            raise self.error or ProtocolError("the apply thread stopped")

    def drop_pending(self) -> None:
        """Forget queued items not yet taken by the thread."""
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                return

    async def finish(self) -> BaseException | None:
        """Let the thread finish what it holds, stop it, and return its error (if any)."""
        self._q.put(None)
        await asyncio.shield(self._done)
        return self.error

    def _run(self) -> None:
        call = self._loop.call_soon_threadsafe
        pacer = CommitPacer(self._window)
        try:
            item = self._q.get()
            while item is not None:
                if not isinstance(item, LogRecord):
                    call(self._report, self._on_heartbeat, item)
                    item = self._q.get()
                    continue
                # Records already queued behind this one go into the same transaction: a
                # replica catching up pays one commit per group, not one per source batch.
                group, size = [item], len(item.payload)
                pacer.arrived(time.monotonic(), size)
                # What ended the group when it is not a record: a heartbeat, or the stop
                # sentinel None — which must not be mistaken for "nothing taken yet" (the
                # thread then waited for ever and `finish` with it).
                taken = False
                deadline = pacer.deadline(time.monotonic())
                while len(group) < GROUP_RECORDS and size < GROUP_BYTES:
                    try:
                        nxt = self._next(deadline, size)
                    except queue.Empty:
                        break
                    if not isinstance(nxt, LogRecord):
                        item, taken = nxt, True
                        break
                    group.append(nxt)
                    size += len(nxt.payload)
                    pacer.arrived(time.monotonic(), len(nxt.payload))
                t0 = time.perf_counter()
                pacer.started(time.monotonic())
                commits = self._apply(group)
                call(self._report_applied, group, commits, time.perf_counter() - t0)
                if not taken:
                    item = self._q.get()
        except Exception as err:
            self.error = err
            call(self._failed)
        finally:
            call(self._finished)

    def _next(self, deadline: float, size: int) -> LogRecord | frames.Heartbeat | None:
        """The next queued item for a group of `size` bytes: what is queued, or, while the
        group is under WINDOW_BYTES, what arrives before `deadline` (queue.Empty: none;
        see `pacing.CommitPacer`)."""
        left = deadline - time.monotonic()
        if left <= 0 or size >= WINDOW_BYTES:
            return self._q.get_nowait()
        return self._q.get(timeout=left)

    def _apply(self, group: list[LogRecord]) -> int:
        """Apply `group` in one transaction; on an error, one by one, so that the records
        before the bad one are kept and the error names the bad one. Returns how many
        transactions it took. The store checks each record's entries in the pass that
        hashes them (`InvalidRecordError` for one no store accepts, the valid prefix
        applied first): a second pass here cost a CRC, a snappy decompression and a Python
        parse per record."""
        checked = all([rec.first_seq in self._checked for rec in group])
        try:
            if len(group) > 1:
                try:
                    self._store.apply_log_records(group, crc_checked=checked)
                    return 1
                except MercuryError:
                    pass
            for rec in group:
                self._apply_one(rec)
            return len(group)
        finally:
            self._checked.difference_update([rec.first_seq for rec in group])

    def _apply_one(self, rec: LogRecord) -> None:
        try:
            self._store.apply_log_records([rec], crc_checked=rec.first_seq in self._checked)
        except ChainError as err:
            seq, head = self._store.head()
            if rec.first_seq == seq + 1:  # continuity held: the hash chain does not
                raise diverged_error(
                    seq, f"hash head {head.hex()} at seq {seq}", _describe(rec)
                ) from err
            raise
        except MercuryError:
            raise
        except Exception as err:  # e.g. lmdb.BadValsizeError: never a crash loop
            raise InvalidRecordError(
                f"log record at seq {rec.first_seq} could not be applied: "
                f"{type(err).__name__}: {err}",
                seq=rec.first_seq,
            ) from err

    def _report(self, cb: Callable[[Any], None], item: Any) -> None:
        self._space.release()
        cb(item)

    def _report_applied(self, group: list[LogRecord], commits: int, seconds: float) -> None:
        for rec in group:
            self._report(self._on_applied, rec)
        self._on_group(group, commits, seconds)

    def _failed(self) -> None:
        self._reader.feed_eof()  # the reader's next read ends the session
        for _ in range(PIPELINE):
            self._space.release()  # and a reader waiting for room goes on to that read

    def _finished(self) -> None:
        if not self._done.done():
            self._done.set_result(None)
        self._space.release()  # a put waiting for room sees the thread gone


class _ApplyInline(_ApplyThread):
    """The apply thread's work done inline on the loop, each item as it is put: a
    simulation's tree runs on one virtual clock, where a thread's work would be off it
    (`replicator/runtime.py`). The same checks and the same reports, in the same order;
    no read-ahead (a put returns once its record is applied), no apply window."""

    def __init__(
        self,
        store: Store,
        loop: asyncio.AbstractEventLoop,
        on_applied: Callable[[LogRecord], None],
        on_heartbeat: Callable[[frames.Heartbeat], None],
        reader: _Reader,
        on_group: Callable[[list[LogRecord], int, float], None],
        window: float = 0.0,
    ) -> None:
        # No thread and no queue: only what `_apply` and the reports use.
        self._store = store
        self._loop = loop
        self._on_applied = on_applied
        self._on_group = on_group
        self._on_heartbeat = on_heartbeat
        self._reader = reader
        self._checked = set()
        self._done = loop.create_future()
        self.error = None

    async def put(self, item: LogRecord | frames.Heartbeat, crc_checked: bool = False) -> None:
        self._raise_if_stopped()
        if not isinstance(item, LogRecord):
            self._on_heartbeat(item)
            return
        if crc_checked:
            self._checked.add(item.first_seq)
        try:
            commits = self._apply([item])
        except Exception as err:
            # As the thread does: stop, and end the reading (its next read ends the
            # session, which then raises this error from `finish`).
            self.error = err
            self._reader.feed_eof()
            self._done.set_result(None)
            return
        self._on_applied(item)
        self._on_group([item], commits, 0.0)

    def drop_pending(self) -> None:
        return None  # nothing is ever queued

    async def finish(self) -> BaseException | None:
        if not self._done.done():
            self._done.set_result(None)
        return self.error
