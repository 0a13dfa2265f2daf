"""The replication worker: the child process of `mercury replica` that writes the store.

It runs, on one asyncio loop, the replication client (apply the upstream stream), the
replication source for downstream replicas (`--repl-listen`) and the status board. Being a
separate process from the readers, its applies never hold the readers' GIL; LMDB's MVCC
keeps readers in the parent from ever waiting for it.

Started by `mercury/replica.py` through `mercury/worker.py` (which sets up the JSON
logging of every Mercury process) with ``CONFIG_JSON``, or as
``python -m replicator.worker CONFIG_JSON``; it exits
when its stdin reaches EOF (the parent died), on SIGTERM, or with `EXIT_REBOOTSTRAP` after
downloading a snapshot that must replace an existing store (the parent, which has that
store open for reading, swaps it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import ssl
import sys
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from core import eventloop, lifeline
from core.errors import (
    BootstrapNeededError,
    CorruptionError,
    ProtocolError,
    RefusedError,
    SnapshotTransferError,
)
from core.tasks import cancel_and_wait
from net.tlsconf import TlsContexts, TlsFiles
from replicator import bootstrap, frames, heap, notify, sched
from replicator.client import APPLY_WINDOW, ReplicaClient, ReplicationFailed
from replicator.heartbeat import RelayedHeartbeat
from replicator.metrics import REFUSED
from replicator.selection import Selector
from replicator.source import ReplicationSource
from replicator.status import StatusBoard
from replicator.tcp import TcpTransport
from replicator.upstream import READS, SpoolForwarder, UpstreamOutbox, UpstreamRouter, relay_to
from store import layout, prune
from store.lock import WriterLock
from store.retention import REPLICA_ANSWERS_KEEP_S, RetentionPolicy, RetentionService
from store.store import Store

log = logging.getLogger("mercury.replication.worker")
T = TypeVar("T")

EXIT_OK = 0
EXIT_REBOOTSTRAP = 3


@dataclass
class WorkerConfig:
    """What the parent tells its worker."""

    data_dir: str
    sources: list[tuple[str, int]]
    repl_listen: tuple[str, int] | None = None
    staleness: float = 30.0
    failback: float = 30.0
    #: `ReplicaClient.apply_window` (seconds).
    apply_window: float = APPLY_WINDOW
    max_bootstraps: int = 1
    sync: bool = True
    #: `store.retention.RetentionPolicy` fields; None = keep the whole log.
    retention: dict[str, Any] | None = None
    #: Niceness added to the worker: on a busy machine the readers (the parent) get the
    #: CPU first, so a heavy stream lags a little instead of slowing reads.
    nice: int = 0
    #: The writer lock's descriptor inherited from the parent (`store.lock.WriterLock`);
    #: None when the worker runs alone and takes the lock itself.
    lock_fd: int | None = None
    #: `net.tlsconf.TlsFiles` fields: mutual TLS to sources and from replicas (None: off).
    tls: dict[str, Any] | None = None
    #: The parent's pid: the worker dies with it (`core.lifeline`). None when run alone.
    parent_pid: int | None = None
    #: CPUs the worker runs on (`--applier-cpus`; the read server has the others), None:
    #: wherever the kernel puts it.
    cpus: list[int] | None = None
    #: `--applier-heap-keep-mb`: free heap kept for the next records (`replicator/heap.py`);
    #: 0 leaves the C library's thresholds alone.
    heap_keep_mb: int = heap.HEAP_KEEP_MB
    #: `--keyspace`: the prefixes of a filtered replica (None: every key).
    keyspaces: list[str] | None = None

    @property
    def prefixes(self) -> tuple[bytes, ...] | None:
        """`keyspaces` as the byte prefixes keys are matched against."""
        return None if self.keyspaces is None else tuple(p.encode() for p in self.keyspaces)

    def to_json(self) -> str:
        """Serialised for the worker's command line."""
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        """Parse the worker's command-line argument."""
        raw = json.loads(text)
        raw["sources"] = [tuple(s) for s in raw["sources"]]
        if raw.get("repl_listen"):
            raw["repl_listen"] = tuple(raw["repl_listen"])
        return cls(**raw)


async def fetch_snapshot(
    cfg: WorkerConfig,
    selector: Selector,
    node_id: bytes,
    db_id: bytes,
    board: StatusBoard,
    tls: TlsContexts | None = None,
) -> frames.SnapshotOffer:
    """Download a whole snapshot from the first source that serves one, resuming after
    cuts; retries until it succeeds (the caller cancels to give up)."""
    while True:
        host, port = selector.current
        try:
            offer = await bootstrap.fetch(
                host,
                port,
                cfg.data_dir,
                node_id=node_id,
                db_id=db_id,
                board=board,
                transport=TcpTransport(tls),
                keyspaces=cfg.prefixes,
            )
            selector.connected()
            return offer
        except (SnapshotTransferError, ProtocolError) as err:
            log.warning("bootstrap from %s:%d cut: %s; resuming", host, port, err)
            board.count_error("bootstrap_cut", str(err))
            wait = selector.retry_same()
        except RefusedError as err:
            log.error("bootstrap from %s:%d refused: %s", host, port, err)
            board.count_error("refused", str(err))
            wait = selector.failed()
        except OSError as err:  # TLS failures too: a source our CA did not sign
            log.warning("bootstrap from %s:%d failed: %s", host, port, err)
            board.count_error("unreachable", f"{host}:{port}: {err}")
            wait = selector.failed()
        await asyncio.sleep(wait)


async def run(cfg: WorkerConfig, stop: asyncio.Event) -> int:
    """Replicate until `stop` is set; return the exit status."""
    # The node's only writer (bootstrap, snapshot install, applies, retention) holds the
    # data directory's lock: the parent's, inherited, or its own when run alone.
    if cfg.lock_fd is not None:
        writer_lock = WriterLock.adopt(cfg.data_dir, cfg.lock_fd)
    else:
        writer_lock = WriterLock.acquire(cfg.data_dir)
    try:
        return await _run_locked(cfg, stop)
    finally:
        writer_lock.release()


async def _run_locked(cfg: WorkerConfig, stop: asyncio.Event) -> int:
    board = StatusBoard(cfg.data_dir)
    board.start()
    node_id = uuid.uuid4().bytes
    # Mutual TLS on both sides of this node's replication; SIGHUP re-reads the files.
    tls = TlsContexts(TlsFiles(**cfg.tls)) if cfg.tls is not None else None
    if tls is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload, tls)
    selector = Selector(list(cfg.sources))
    store: Store | None = None
    source: ReplicationSource | None = None
    gc: RetentionService | None = None
    spool: SpoolForwarder | None = None
    try:
        if not layout.exists(cfg.data_dir):
            board.update(state="bootstrapping")
            offer = await _until(
                stop, fetch_snapshot(cfg, selector, node_id, frames.ZERO_ID, board, tls)
            )
            if offer is None:
                return EXIT_OK
            try:
                store = bootstrap.install(cfg.data_dir, offer)
            except CorruptionError as err:
                board.count_error("bootstrap_corrupt", str(err))
                raise
            store.close()
        # A replica acknowledges no write: a commit a system crash undoes is fetched
        # again from the source (which streams to a replica that is ahead of it once it
        # has the records), so each commit skips the synchronous write of its meta page,
        # one of its two (docs/replication.md). The data pages are synced as before: a
        # crash never leaves the store corrupt.
        store = Store.open(cfg.data_dir, sync=cfg.sync, last_commit_durable=False)
        if not _filter_store(store, cfg.prefixes, board):
            await stop.wait()  # the parent serves what the store holds; nothing to apply
            return EXIT_OK
        notify.install_pinger(store)
        relay = RelayedHeartbeat()
        # Upstream frames of this node, and of downstream replicas relayed toward the root.
        outbox = UpstreamOutbox()
        router = UpstreamRouter()
        router.fallback = relay_to(outbox)
        # The parent's readers spool their read summaries here (reads/readstats.py).
        spool = SpoolForwarder(os.path.join(cfg.data_dir, "readstats"), outbox, READS)
        await spool.start()
        if cfg.repl_listen is not None:
            source = ReplicationSource(
                store,
                cfg.repl_listen[0],
                cfg.repl_listen[1],
                node_id=node_id,
                heartbeat=relay,
                max_bootstraps=cfg.max_bootstraps,
                tls=tls,
                upstream=router,
                transport=TcpTransport(tls),
            )
            source.keyspaces = cfg.prefixes
            # The parent exports the refusals' counts (it serves /metrics).
            source.on_refused = lambda _reason: board.update(refused=REFUSED.counts())
            await source.start()
            relay.add_listener(source.wake)
        if cfg.retention is not None:
            # The worker is this node's only writer, so it also collects the log.
            # Answers come through the log: a replica forgets them on its own (a week).
            keep = {**cfg.retention, "idempotency_keep_seconds": REPLICA_ANSWERS_KEEP_S}
            gc = RetentionService(store, RetentionPolicy(**keep))
            await gc.start()
        client = ReplicaClient(
            store,
            selector,
            node_id=node_id,
            board=board,
            relay=relay,
            staleness=cfg.staleness,
            failback=cfg.failback,
            apply_window=cfg.apply_window,
            tls=tls,
            outbox=outbox,
            transport=TcpTransport(tls),
            keyspaces=cfg.prefixes,
        )
        try:
            await _until(stop, client.run())
        except BootstrapNeededError as err:
            log.warning("%s", err)
            board.update(state="bootstrapping", error=str(err))
            db_id = uuid.UUID(store.db_id).bytes
            offer = await _until(stop, fetch_snapshot(cfg, selector, node_id, db_id, board, tls))
            if offer is None:
                return EXIT_OK
            board.update(state="rebootstrap-ready")
            return EXIT_REBOOTSTRAP
        except ReplicationFailed as err:
            log.error("replication stopped: %s", err)
            if source is not None and err.abandoned is not None:
                # A diverged history is not handed on: replicas below that hold it too
                # learn it from the refusal and stop as diverged themselves.
                source.stop_as_diverged(*err.abandoned, str(err))
            # Keep serving the parent's readers what we have (and downstream replicas,
            # unless diverged).
            await stop.wait()
        return EXIT_OK
    finally:
        if spool is not None:
            await spool.stop()
        if gc is not None:
            await gc.stop()
        if source is not None:
            await source.stop()
        if store is not None:
            store.close()
        if board.status.state not in ("failed", "diverged", "rebootstrap-ready"):
            board.update(state="stopped")
        await board.stop()


def _filter_store(store: Store, wanted: tuple[bytes, ...] | None, board: StatusBoard) -> bool:
    """Make `store` hold `wanted` (`store/prune.py`): prune it the first time (after its
    bootstrap, or when the prefixes narrow); False, with the reason in the status, when it
    cannot (it holds fewer keys than asked)."""
    held = prune.held_keyspaces(store)
    why = prune.check_keyspaces(held, wanted)
    if why is not None:
        log.error("replication stopped: %s", why)
        board.update(state="failed", error=why)
        return False
    if wanted is not None and held != wanted:
        removed = prune.prune(store, wanted)
        log.info("pruned %d keys outside the keyspaces %s", removed, list(wanted))
    return True


def _reload(tls: TlsContexts) -> None:
    """SIGHUP: new connections use the re-read files; a failed reload keeps the old."""
    try:
        tls.reload()
        log.info("TLS certificates re-read from %s", tls.files.cert)
    except (OSError, ssl.SSLError) as err:
        log.error("TLS reload failed, keeping the current certificates: %s", err)


async def _until(stop: asyncio.Event, coro: Coroutine[Any, Any, T]) -> T | None:
    """Run `coro` until it ends or `stop` is set (then cancel it and return None)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    await cancel_and_wait(task)  # until it is done, even if a cancellation was swallowed
    return None


async def _main(cfg: WorkerConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # The parent holds our stdin open; EOF means it is gone and so must we be.
    fd = sys.stdin.fileno()
    os.set_blocking(fd, False)

    def _on_stdin() -> None:
        try:
            data = os.read(fd, 4096)
        except BlockingIOError:
            return
        if not data:
            loop.remove_reader(fd)
            stop.set()

    loop.add_reader(fd, _on_stdin)
    return await run(cfg, stop)


def main(argv: list[str]) -> int:
    """Entry point: ``python -m replicator.worker CONFIG_JSON``."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s worker %(name)s %(levelname)s %(message)s"
    )
    cfg = WorkerConfig.from_json(argv[1])
    if cfg.parent_pid is not None:
        # A replica killed is killed whole: its worker applying on for the moment it takes
        # to see its stdin's EOF would write a store everyone considers stopped.
        lifeline.bind_to_parent(cfg.parent_pid)
    if cfg.nice > 0:
        os.nice(cfg.nice)
    if cfg.cpus:
        sched.pin(os.getpid(), frozenset(cfg.cpus))
    # Reads preempt this process when they wake (the read server asked for short slices,
    # which we inherited and give up here): replicator/sched.py.
    sched.background_applier()
    if cfg.heap_keep_mb > 0 and not heap.keep_freed_memory(trim_bytes=cfg.heap_keep_mb << 20):
        log.info("the C library refused the malloc thresholds: it hands freed memory back")
    eventloop.install()  # uvloop: the source falls back from sendfile on it
    return asyncio.run(_main(cfg))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
