"""`mercury root`: the root process — store writer, gateway, replication source, readers.

Thin wiring only: open the store (durable: fsync on every commit), ask the replication and
reads components for the services they run on the root, build the gateway app with them,
and run it under uvicorn (uvloop + httptools, no access log: per-request logging costs a
third of the throughput; the batcher logs one structured line per batch instead).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from core.addr import UnixAddr
from core.errors import ConfigError
from core.service import Service
from gateway.app import create_app
from gateway.fastpath import FastPath
from gateway.protocol_writer import kt_writer_for
from gateway.read_tokens import GatewayReadTokens
from mercury import gctune, logsetup, tls, upgrade
from mercury.settings import RootConfig
from mercury.unused_wiring import RootUnused
from net import handover, http_bounds, uvicorn_http
from net.metrics import watch_certs
from net.tcp import TcpService
from net.tlsconf import TlsContexts
from store import metrics as store_metrics
from store.lock import StoreLockedError, WriterLock
from store.retention import RetentionService
from store.store import Store

WATCH_ONLY = frozenset({"watch"})  # the read kinds ReadAuth guards on a root without --read-auth

log = logging.getLogger("mercury.root")


def run_root(args: argparse.Namespace) -> int:
    """Run the root until SIGTERM/SIGINT; the open batch is committed before exit."""
    if args.ha_etcd and not args.ha_await_go:  # a root candidate (ha/candidate.py)
        from ha.candidate import run_candidate

        return run_candidate(args, tls.files_from_args(args, frozenset({"root"})))
    # Imported here so `mercury --help` does not load the other components.
    from mercury import listeners as reads_wiring
    from reads import watch as reads_watch
    from reads.auth import ReadAuth
    from replicator import wiring as repl_wiring

    if args.ha_await_go:  # a candidate's warm root: wait until elected (ha_leader.py)
        from ha import leader as ha_leader

        ha_leader.wait_for_go(args)

    cfg = RootConfig.from_args(args)
    bounds = http_bounds.HttpBounds.from_args(args)
    reads_watch.set_limits(reads_watch.WatchLimits.from_args(args))
    # The commit thread and the event loop share the GIL; with the default 5 ms switch
    # interval a busy loop (a producer flooding) stretches every commit by several 5 ms
    # waits, which delays every producer's acks. A shorter interval keeps commits short.
    sys.setswitchinterval(cfg.switch_interval_s)
    gctune.tune_for_batches()
    host, port = cfg.listen
    # Started by a hand-over (`kill -USR2` on the old root): the old process holds the
    # writer lock until this one says it is prepared; it is taken below, just before the
    # store opens, so that everything up to there is done while the old one still serves.
    # A candidate's warm root inherits its front's socket, and no writer lock from anyone.
    takeover = handover.handed_over() and not args.ha_await_go
    # One writer per store: a second root (or a replica worker) on this directory fails
    # here, naming the holder, before it opens anything.
    writer_lock = None if takeover else WriterLock.acquire(cfg.data_dir, create=False)
    if not args.ha_await_go:
        try:
            _refuse_replica_store(cfg.data_dir)
        except BaseException:
            if writer_lock is not None:
                writer_lock.release()
            raise
    tls.check_tokenless_listeners(
        [("kt", cfg.listeners.kt), ("memcached", _local(cfg.listeners.memcached))],
        cfg.allow_unauthenticated_reads,
    )
    tls.warn_plaintext(
        [("gateway", cfg.listen), ("replication", cfg.source.listen), ("kt", cfg.listeners.kt)],
        cfg.tls is not None,
    )
    # Built before anything listens: unreadable or mismatched files fail the start.
    repl_tls = TlsContexts(cfg.tls) if cfg.tls is not None else None
    # KT writes as one producer: the gateway's write path, bound once the app exists.
    kt_writer = kt_writer_for(cfg.kt_producer, cfg.listeners.kt)
    mc_writer = kt_writer_for(
        cfg.memcached_producer,
        _local(cfg.listeners.memcached),
        flag="--memcached-producer",
        listen_flag="--memcached-listen",
        protocol="memcached",
    )
    if writer_lock is None:
        handover.report(handover.PREPARED)
        # The old root now stops accepting, answers its open batch and gives the lock up;
        # connections meanwhile wait in the shared sockets' queues, none is refused.
        writer_lock = _take_writer_lock(cfg.data_dir, args.drain_s + args.handover_timeout_s)
    store = Store.open(cfg.data_dir, sync=cfg.sync)
    store_metrics.watch(store)  # map and disk room, for the alerts (deploy/prometheus)
    if cfg.tls is not None:
        watch_certs(cfg.tls)
    unused = RootUnused(store)  # unused-key analytics: read summaries in, the ledger
    try:
        services: list[Service] = [
            # `handed_to`: the new root's PID after a hand-over (docs/operations.md), as a
            # replica's stop says it.
            logsetup.StopLog(
                log,
                lambda: {"role": "root", "seq": store.last_seq(), "handed_to": server.handed_to},
            ),
            *repl_wiring.root_services(store, cfg.source, repl_tls, unused.router),
            *reads_wiring.root_services(store, cfg.listeners, kt_writer, mc_writer),
            RetentionService(store, cfg.retention),
        ]
        services += unused.services
        app = create_app(cfg.gateway, store, services)
        unused.attach(app)
        if args.ha_await_go:  # elected: fencing, sync acks, term (ha_leader.py)
            ha_leader.install(app, store, services, args)
        for writer in (kt_writer, mc_writer):
            if writer is not None:
                writer.app = app
        asgi: Any = FastPath(app)
        if cfg.read_auth:
            # Reads take consumer tokens too (each sees its keyspaces), checked against the
            # gateway's live token index: the one rule of reads/auth.py, as on replicas.
            asgi = ReadAuth(asgi, GatewayReadTokens(app))
        else:
            # The root's watch streams values like a read: without --read-auth it takes the
            # tokens the root's point GET takes (a producer's keyspaces, or the admin).
            asgi = ReadAuth(asgi, GatewayReadTokens(app, consumers=False), only=WATCH_ONLY)
        config = uvicorn.Config(
            asgi,
            host=host,
            port=port,
            loop="uvloop",
            # httptools under idle/header timeouts and a connection cap (net/http_bounds.py)
            **http_bounds.uvicorn_options(bounds),
            access_log=False,
            log_level="warning",
            log_config=None,  # uvicorn's lines go through the JSON root handler too
            lifespan="on",
            **tls.uvicorn_ssl(cfg.tls),  # type: ignore[arg-type]
        )
        if cfg.tls is not None:
            # uvicorn builds its one SSL context when it starts; SIGHUP reloads it in place.
            services.append(tls.TlsReloader(cfg.tls, repl_tls, lambda: config.ssl))
        logsetup.event(
            log,
            "start",
            role="root",
            version=logsetup.mercury_version(),
            db_id=store.db_id,
            listen=_hp(cfg.listen),
            repl_listen=_hp(cfg.source.listen),
            kt_listen=_hp(cfg.listeners.kt),
            memcached_listen=_hp(cfg.listeners.memcached),
            seq=store.last_seq(),
            tls=cfg.tls is not None,
            read_auth=cfg.read_auth,
        )
        server = _RootServer(config)
        server.drain_s = args.drain_s
        server.upgradable = not args.ha_await_go
        server.on_hand_over = lambda: _hand_over_services(app, services, args.drain_s)
        if takeover:
            # The writers queued through the switch are answered at once, not a window on.
            server.on_serving = lambda: app.state.gw.batcher.hurry(
                cfg.gateway.batch_window_ms / 1000
            )
        server.handover_timeout_s = args.handover_timeout_s
        # GET /v1/watch on the root too; its endless streams end once the server stops.
        reads_watch.install(app, store)
        reads_watch.end_streams_when(app, lambda: server.should_exit)
        # The listening socket: inherited on a hand-over or from systemd, else bound here.
        server.run(sockets=[handover.SOCKETS.listen(handover.HTTP, cfg.listen)])
    finally:
        store.close()
        writer_lock.release()
    return 0


class _RootServer(uvicorn_http.Server):
    """uvicorn with SIGTERM/SIGINT on its own loop's handlers: uvicorn's signal capture
    raises the signal again once it has served, and the default SIGTERM action then kills
    the process after a clean stop (exit status 143 instead of 0)."""

    drain_s = upgrade.DRAIN_S
    handover_timeout_s = upgrade.HANDOVER_TIMEOUT_S
    #: An HA candidate's root (`--ha-await-go`) is not handed over: its candidate owns it.
    upgradable = True
    #: Called as the hand-over begins: the batcher commits what it holds at once.
    on_hand_over: Callable[[], None] | None = None
    #: Called once this server accepts (a hand-over's new root).
    on_serving: Callable[[], None] | None = None
    #: The new root's PID once a hand-over passed it the sockets (for the stop event).
    handed_to: int | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        # SIGUSR2: hand the sockets and then the writer lock to the new executable
        # (mercury/upgrade.py); the old root answers everything it took and exits 0.
        if self.upgradable:
            handover.Upgrader(
                "root",
                wait_for=handover.PREPARED,
                on_go=self._hand_over,
                timeout=self.handover_timeout_s,
            ).install(loop)
        else:
            handover.refuse_handover(loop, "an HA candidate's root (upgrade candidates one by one)")
        stopped = asyncio.Event()
        ready = loop.create_task(handover.report_when_serving(self, stopped, self.on_serving))
        try:
            await super().serve(sockets)
        finally:
            stopped.set()
            await ready

    async def _hand_over(self, succ: handover.Successor) -> None:
        self.handed_to = succ.pid
        # Idle keep-alive connections get a short grace only: the writer lock (and with it
        # the new root) waits for every connection of this one to end.
        self.drain(min(upgrade.ROOT_IDLE_GRACE_S, self.drain_s), self.drain_s)
        if self.on_hand_over is not None:
            self.on_hand_over()


def _hand_over_services(app: Any, services: list[Service], drain_s: float) -> None:
    """As the old root hands over: its batcher commits at once from now on, and its KT and
    memcached listeners stop accepting and close each connection once it is idle."""
    app.state.gw.batcher.hurry()
    loop = asyncio.get_running_loop()
    for s in services:
        if isinstance(s, TcpService):
            _DRAINS.add(task := loop.create_task(s.drain(drain_s)))
            task.add_done_callback(_DRAINS.discard)


#: The listeners' drains under way (held: the loop keeps only weak references to tasks).
_DRAINS: set[asyncio.Task[None]] = set()


def _take_writer_lock(data_dir: str, timeout: float) -> WriterLock:
    """The writer lock, once the old root gave it up (polled: flock has no timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            held = WriterLock.acquire(data_dir, create=False)
        except StoreLockedError:
            if time.monotonic() > deadline:
                handover.report(handover.FAILED, "the old root kept the writer lock")
                raise
            time.sleep(0.002)
            continue
        logsetup.event(log, "writer-lock", role="root", how="handover")
        return held


def _refuse_replica_store(data_dir: str) -> None:
    """A replica's store (its status file is there: it was never promoted) must not start
    writing as a root: its old root may still write the same history, and every node of
    both would then hold two different records at one seq. `mercury promote` records the
    change of root in the log first (and removes the status file). An HA candidate's own
    root process is exempt: it records its term the same way when elected."""
    from replicator.status import status_path

    if os.path.exists(status_path(data_dir)):
        raise ConfigError(
            f"{data_dir} holds a replica's store (never promoted): refusing to write to it "
            "as a root",
            hint=f"stop the replica, then `mercury promote {data_dir}` and start the root "
            "(a store left by an HA candidate's standby needs the same)",
        )


def _local(addr: tuple[str, int] | UnixAddr | None) -> tuple[str, int] | None:
    """A TCP address as it is; a unix socket is local, as loopback is (for the checks)."""
    return ("127.0.0.1", 0) if isinstance(addr, UnixAddr) else addr


def _hp(addr: tuple[str, int] | UnixAddr | None) -> str | None:
    if isinstance(addr, UnixAddr):
        return str(addr)
    return f"{addr[0]}:{addr[1]}" if addr is not None else None
