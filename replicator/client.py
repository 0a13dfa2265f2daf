"""The replica's replication client: connect to a source, handshake, apply the stream.

Contract:

- Streams from the store's last applied seq + 1 (after a restart: no replay, no skip).
- Each RECORD is checked for continuity before it is applied (a record not starting right
  after the last applied seq is a gap or a repeat: StreamGapError, nothing applied) and
  applied in one transaction by `Store.apply_log_record`, which checks the CRC and the hash
  chain. Applies run in one worker thread so the event loop — which also serves this
  node's downstream replicas — never stalls on a commit.
- A broken stream (bad frame, gap, repeat, cut) is logged with what was expected and what
  came, counted, and the client reconnects and resumes from the last applied seq. A hash
  chain mismatch on a well-formed record means the histories differ: replication stops with
  a clear error (`state = "failed"`); reads keep being served.
- Ordered sources with a staleness rule (no new record nor new root heartbeat for
  `staleness` seconds: move to the next source) and bounded backoff (`selection.py`).
- `BootstrapNeededError` (source lost the history) ends `run()`: the caller bootstraps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from mercury.errors import (
    BootstrapNeededError,
    ChainError,
    CorruptionError,
    DbIdMismatchError,
    ProtocolError,
    RefusedError,
    SelfReplicationError,
    StreamGapError,
)
from replicator import frames, wire
from replicator.heartbeat import RelayedHeartbeat
from replicator.selection import Selector
from replicator.status import StatusBoard
from store.ops import LogRecord
from store.store import Store

log = logging.getLogger("mercury.replication.client")

CONNECT_TIMEOUT = 5.0
#: Batches read ahead while one is being applied.
PIPELINE = 32
#: Stream buffer: a whole large log record fits, so reading never stops mid-record.
READ_LIMIT = 16 << 20


class ReplicationFailed(Exception):
    """Replication cannot continue without an operator (diverged history)."""


def refusal_error(r: frames.Refuse) -> RefusedError:
    """The named error for a source's refusal."""
    cls: type[RefusedError] = {
        frames.REFUSE_DB_ID: DbIdMismatchError,
        frames.REFUSE_SELF: SelfReplicationError,
        frames.REFUSE_BOOTSTRAP: BootstrapNeededError,
    }.get(r.code, RefusedError)
    return cls(f"source refused: {r.message}", code=r.code)


class ReplicaClient:
    """Keeps `store` following the first healthy of `selector.sources`."""

    def __init__(
        self,
        store: Store,
        selector: Selector,
        *,
        node_id: bytes,
        board: StatusBoard,
        relay: RelayedHeartbeat,
        staleness: float = 30.0,
    ) -> None:
        self.store = store
        self.selector = selector
        self.node_id = node_id
        self.board = board
        self.relay = relay
        self.staleness = staleness
        self._db_id = bytes.fromhex(store.db_id.replace("-", ""))
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="apply")
        seq, _ = store.head()
        self.applied = seq
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
                except RefusedError as err:
                    log.error("source %s: %s", name, err)
                    self.board.count_error("refused", f"{name}: {err}")
                    wait = self.selector.failed()
                except _Stale:
                    msg = f"source {name} stale: nothing new for {self.staleness:g}s"
                    log.warning("%s; moving to the next source", msg)
                    self.board.count_error("stale", msg)
                    wait = self.selector.stale()
                except (StreamGapError, ProtocolError, CorruptionError) as err:
                    if isinstance(err, ChainError):
                        raise  # gaps are caught before apply: this is a chain mismatch
                    log.warning(
                        "stream from %s broken: %s; resuming at seq %d", name, err, self.applied + 1
                    )
                    self.board.count_error(type(err).__name__, f"{name}: {err}")
                    wait = self.selector.retry_same()
                except (OSError, TimeoutError) as err:
                    log.info("source %s unreachable: %s", name, err)
                    self.board.count_error("unreachable", f"{name}: {err}")
                    wait = self.selector.failed()
                self.board.update(state="reconnecting")
                if wait:
                    await asyncio.sleep(wait)
        except ChainError as err:
            self.board.update(state="failed", error=str(err))
            raise ReplicationFailed(str(err)) from err
        finally:
            self._exec.shutdown(wait=True)

    async def _session(self, host: str, port: int) -> None:
        self.board.update(state="connecting", source=f"{host}:{port}")
        self.applied = self.store.last_seq()
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, limit=READ_LIMIT), CONNECT_TIMEOUT
        )
        try:
            hello = frames.Hello(
                frames.PROTOCOL_VERSION,
                frames.MODE_STREAM,
                0,
                self.node_id,
                self._db_id,
                self.applied,
                0,
                0,
                frames.ZERO_SHA,
            )
            await wire.send(writer, frames.encode_hello(hello))
            ftype, body = await asyncio.wait_for(wire.read_frame(reader), CONNECT_TIMEOUT)
            if ftype == frames.REFUSE:
                raise refusal_error(frames.decode_refuse(body))
            if ftype != frames.WELCOME:
                raise ProtocolError(f"expected WELCOME, got frame type {ftype}")
            frames.decode_welcome(body)
            self.selector.connected()
            self.board.update(state="streaming", error=None)
            log.info("streaming from %s:%d at seq %d", host, port, self.applied + 1)
            await self._stream(reader)
        finally:
            await wire.close(writer)

    async def _stream(self, reader: asyncio.StreamReader) -> None:
        """Read frames and apply them in a pipeline: while one batch commits in the apply
        thread, the loop already reads and checks the next ones (bounded queue)."""
        q: asyncio.Queue[LogRecord | frames.Heartbeat | None] = asyncio.Queue(PIPELINE)
        applier = asyncio.ensure_future(self._apply_loop(q, reader))
        failure: BaseException | None = None
        try:
            await self._read_loop(reader, q)
        except BaseException as err:  # re-raised below, after the applier has settled
            failure = err
        if failure is not None:
            while not q.empty():  # not applied: the next session streams them again
                q.get_nowait()
        if not applier.done():
            await q.put(None)
        try:
            # Never abandon an apply in flight: `applied` must match the store.
            await asyncio.shield(applier)
        except Exception as err:
            raise err from failure
        if failure is not None:
            raise failure

    async def _apply_loop(
        self, q: asyncio.Queue[LogRecord | frames.Heartbeat | None], reader: asyncio.StreamReader
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while (item := await q.get()) is not None:
                if isinstance(item, LogRecord):
                    await loop.run_in_executor(self._exec, self.store.apply_log_record, item)
                    self.applied = item.last_seq
                    st = self.board.status
                    self.board.update(
                        applied_seq=item.last_seq, known_us=max(st.known_us, item.time_us)
                    )
                else:
                    st = self.board.status
                    known = max(st.known_us, item.time_us) if self.applied >= item.seq else None
                    self.board.update(
                        hb_time_us=item.time_us,
                        hb_seq=item.seq,
                        hb_interval_ms=item.interval_ms,
                        known_us=st.known_us if known is None else known,
                    )
        except Exception:
            reader.feed_eof()  # wake the reader: the session ends with this error
            raise

    async def _read_loop(
        self, reader: asyncio.StreamReader, q: asyncio.Queue[LogRecord | frames.Heartbeat | None]
    ) -> None:
        received = self.applied
        fresh_at = time.monotonic()
        while True:
            left = self.staleness - (time.monotonic() - fresh_at)
            if left <= 0:
                raise _Stale()
            try:
                ftype, body = await asyncio.wait_for(wire.read_frame(reader), left)
            except TimeoutError:
                raise _Stale() from None
            if ftype == frames.RECORD:
                rec = wire.parse_record(body)
                if rec.first_seq != received + 1:
                    kind = "repeat" if rec.first_seq <= received else "gap"
                    raise StreamGapError(
                        f"seq {kind}: expected a record starting at seq {received + 1}, "
                        f"got one starting at {rec.first_seq}",
                        seq=received,
                    )
                received = rec.last_seq
                fresh_at = time.monotonic()
                self.selector.progressed()
                await q.put(rec)
            elif ftype == frames.HEARTBEAT:
                hb = frames.decode_heartbeat(body)
                if hb.sent_seq > received:
                    raise StreamGapError(
                        f"seq gap: the source sent up to seq {hb.sent_seq}, this replica "
                        f"received only up to {received}",
                        seq=received,
                    )
                if self.relay.update(hb):  # relayed downstream at once
                    fresh_at = time.monotonic()
                    self.selector.progressed()
                await q.put(hb)
            elif ftype == frames.REFUSE:
                raise refusal_error(frames.decode_refuse(body))
            elif ftype == frames.END:
                return
            else:
                raise ProtocolError(f"unexpected frame type {ftype} in a stream")


class _Stale(Exception):
    """No new record nor new heartbeat for the staleness period."""
