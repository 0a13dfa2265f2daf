"""`mercury replica`: the replica process — readers in this process, the writer in a child.

The parent serves reads (HTTP read API, KT and memcached listeners of `reads/`) from the
store it opens read-only; a child process (`replicator/worker.py`) applies the upstream
stream and serves downstream replicas. Applying a heavy stream therefore never holds the
readers' GIL nor their event loop, and LMDB's MVCC never makes a reader wait for the
writer. The child publishes its status in ``DATA_DIR/replication.json``; the parent exports
it on `/v1/status` and `/metrics`. A child that dies is restarted with bounded backoff while
reads go on. A child that downloaded a snapshot to replace a store whose history its source
no longer has exits with `EXIT_REBOOTSTRAP`: the parent stops serving, moves the old store
aside, and re-executes itself, which installs the snapshot (reads pause for that swap).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import uvicorn

from core import eventloop
from core.addr import UnixAddr
from core.errors import ConfigError
from mercury import logsetup, tls, upgrade
from mercury.settings import ReplicaConfig
from net import handover, http_bounds, uvicorn_http
from net.metrics import watch_certs
from net.tcp import TcpService
from reads import keyspaces as read_keyspaces
from reads import workermetrics, workers
from replicator import sched
from replicator.metrics import (
    APPLIED_SEQ,
    APPLIER,
    DIVERGED,
    REFUSED,
    REPLICATION_LAG,
    STREAMING,
    WORKER_RESTARTS,
)
from replicator.status import diverged, lag_gauge, read_status, streaming
from replicator.worker import EXIT_REBOOTSTRAP, WorkerConfig
from store import layout
from store import metrics as store_metrics
from store.lock import WriterLock
from store.store import Store

log = logging.getLogger("mercury.replica")

RESTART_BASE = 0.5
RESTART_CAP = 10.0
#: A worker that ran this long resets the restart backoff.
RESTART_RESET_AFTER = 60.0


class WorkerSupervisor:
    """Starts the replication worker and restarts it with bounded backoff when it dies."""

    def __init__(
        self, cfg: WorkerConfig, stopping: asyncio.Event | None = None, log_level: str = "info"
    ) -> None:
        self.cfg = cfg
        self.log_level = log_level
        # Set by the parent on SIGTERM: a worker that exits then is not restarted (it may
        # have received the same signal from its process group).
        self._parent_stopping = stopping or asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.rebootstrap = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        """Start the worker and its watchdog."""
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _spawn(self) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mercury.worker",
            "--log-level",
            self.log_level,
            dataclasses.replace(self.cfg, parent_pid=os.getpid()).to_json(),
            stdin=subprocess.PIPE,
            # The writer lock's descriptor: the worker holds the parent's lock.
            pass_fds=() if self.cfg.lock_fd is None else (self.cfg.lock_fd,),
        )

    async def _watch(self) -> None:
        delay = RESTART_BASE
        while not self._stopping:
            started = time.monotonic()
            self.proc = await self._spawn()
            code = await self.proc.wait()
            if self._stopping or self._parent_stopping.is_set():
                return
            if code == EXIT_REBOOTSTRAP:
                self.rebootstrap.set()
                return
            WORKER_RESTARTS.inc()
            if time.monotonic() - started > RESTART_RESET_AFTER:
                delay = RESTART_BASE
            log.warning("replication worker exited with %s; restarting in %.1fs", code, delay)
            await asyncio.sleep(delay)
            delay = min(RESTART_CAP, delay * 2)

    def signal(self, sig: int) -> None:
        """Send `sig` to the running worker (by its pid), if any."""
        p = self.proc
        if p is not None and p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(sig)

    async def stop(self) -> None:
        """Stop the worker (SIGTERM, then SIGKILL after 10 s)."""
        self._stopping = True
        p = self.proc
        if p is not None and p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(p.wait(), 10)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def replica_status(data_dir: str, keyspaces: list[str] | None = None) -> dict[str, object]:
    """Replication facts for `GET /v1/status` (`source`, `lag_seconds`, worker state,
    and `keyspaces`: a filtered replica's prefixes, null for a full one)."""
    st = read_status(data_dir)
    if st is None:
        return {
            "source": None,
            "lag_seconds": None,
            "replication_state": "starting",
            "keyspaces": keyspaces,
        }
    return {
        "keyspaces": keyspaces,
        "source": st.source,
        "lag_seconds": st.lag(),
        "replication_state": st.state,
        "replication_error": st.error,
        "replication_errors": st.errors,
    }


class _Server(uvicorn_http.Server):
    """uvicorn without its own signal capture (our loop handlers set `should_exit`), and
    HTTPS on `net/tlsconn.py`'s transport (TLS on the socket, driven by readiness) instead
    of the loop's memory-BIO TLS layer: half its cost per keep-alive request."""

    def tls_listener(self) -> uvicorn_http.TlsStart | None:
        if os.environ.get("MERCURY_HTTPS_LOOP_TLS") == "1":
            return None  # the loop's own TLS layer, for bench/tls.py's A/B
        # As many handshakes in progress as the listener takes connections
        return http_bounds.start_tls


def _forward_hup(sup: WorkerSupervisor, pool: workers.ReaderPool | None) -> None:
    sup.signal(signal.SIGHUP)
    if pool is not None:
        pool.signal(signal.SIGHUP)  # each reader reloads its own HTTPS context


async def _read_side(
    config: ReplicaConfig, bounds: http_bounds.HttpBounds, store: Store, index: int, n: int
) -> tuple[Any, list[Any], uvicorn.Config, socket.socket]:
    """What every reader process serves: the read app, the KT/memcached listeners and the
    read counter (started), and the HTTP listener's config and socket (one of `n` sharing
    the address with SO_REUSEPORT when `n` > 1), under `bounds` (`--http-*`, as the
    root's gateway: each reader process bounds its own connections)."""
    from mercury.listeners import replica_services
    from reads.fasthttp import fast_read_protocol
    from reads.http_app import create_read_app
    from reads.readstats import ReadStatsService, spool

    cfg = config.worker

    # A filtered replica answers reads outside its keyspaces with a 421 naming its sources.
    read_keyspaces.configure(cfg.prefixes, (f"{h}:{p}" for h, p in cfg.sources))
    REPLICATION_LAG.set_function(lambda: lag_gauge(cfg.data_dir))
    DIVERGED.set_function(lambda: diverged(cfg.data_dir))
    STREAMING.set_function(lambda: streaming(cfg.data_dir))
    store_metrics.watch(store)  # map and disk room, for the alerts (deploy/prometheus)
    if config.tls is not None:
        watch_certs(config.tls)
    REFUSED.external = lambda: _worker_refused(cfg.data_dir)
    APPLIER.source = lambda: read_status(cfg.data_dir)
    APPLIED_SEQ.set_function(lambda: float(store.last_seq()))
    app = create_read_app(
        store,
        role="replica",
        status=lambda: replica_status(cfg.data_dir, cfg.keyspaces),
        read_auth=config.read_auth,
    )
    if n > 1:
        app.state.readers = (os.path.join(cfg.data_dir, "readers"), index, n)
    listeners = dataclasses.replace(config.listeners, reuse_port=n > 1)
    # Reads counted for unused-key analytics, spooled for the worker to send upstream (each
    # reader spools its own summaries; the root merges them).
    services = [*replica_services(store, listeners), ReadStatsService(spool(cfg.data_dir))]
    for s in services:
        await s.start()
    host, port = _tcp(config.listen)
    asgi: Any = app
    tokens = None
    if config.read_auth:
        from reads.auth import AclTokenIndex, ReadAuth

        tokens = AclTokenIndex(store)
        asgi = ReadAuth(app, tokens)
    uv_config = uvicorn.Config(
        asgi,
        host=host,
        port=port,
        # Point gets answered in the protocol, everything else through ASGI (reads/fasthttp.py),
        # under idle/header timeouts and a connection cap (net/http_bounds.py); over
        # HTTPS too (`_Server.startup` hands the same class to net/tlsconn.py).
        **http_bounds.uvicorn_options(bounds, fast_read_protocol(store, tokens)),
        access_log=False,
        log_level="warning",
        log_config=None,  # uvicorn's lines go through the JSON root handler too
        lifespan="off",
        **tls.uvicorn_ssl(config.tls),  # type: ignore[arg-type]
    )
    # The process's HTTP socket: inherited on a hand-over or from systemd (net/handover.py).
    sock = handover.SOCKETS.listen(handover.HTTP, config.listen, reuse_port=n > 1)
    return app, services, uv_config, sock


async def _serve_reader(
    config: ReplicaConfig,
    bounds: http_bounds.HttpBounds,
    index: int,
    n: int,
    drain_s: float = upgrade.DRAIN_S,
) -> int:
    """Reader `index` of `n` (`--read-workers`): the read side only, on the same ports as
    reader 0 (the replica process), until SIGTERM or until reader 0 is gone. The store is
    the one reader 0's replication worker applies to; this process never writes."""
    from reads import watch

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store = Store.open(config.worker.data_dir, readonly=True)
    app, services, uv_config, sock = await _read_side(config, bounds, store, index, n)
    server = _Server(uv_config)
    watch.end_streams_when(app, lambda: server.should_exit)
    reloader: tls.TlsReloader | None = None
    if config.tls is not None:
        reloader = tls.TlsReloader(config.tls, None, lambda: uv_config.ssl)
        await reloader.start()
    metrics_dir = os.path.join(config.worker.data_dir, "readers")
    helpers = [
        loop.create_task(workermetrics.keep_writing(metrics_dir, index, stop)),
        loop.create_task(workers.exit_with_parent(stop)),
    ]
    serving = loop.create_task(server.serve(sockets=[sock]))
    # Started by a new reader 0 during a hand-over: its startup niceness, undone.
    handover.restore_priority()
    # A hand-over: reader 0 asks for this reader's sockets (for the new executable's
    # reader `index`), then sends SIGQUIT: drain as reader 0 does, and exit.
    channel = loop.create_task(handover.serve_channel(handover.SOCKETS))
    drains: list[asyncio.Task[None]] = []

    def quit_() -> None:
        server.drain(drain_s, drain_s)
        drains.extend(
            loop.create_task(s.drain(drain_s)) for s in services if isinstance(s, TcpService)
        )

    loop.add_signal_handler(signal.SIGQUIT, quit_)
    stopper = loop.create_task(stop.wait())
    await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stop.set()
    with contextlib.suppress(Exception):
        await serving
    channel.cancel()
    for h in (*helpers, *drains, stopper):
        with contextlib.suppress(Exception):
            await h
    for s in reversed(services):
        with contextlib.suppress(Exception):
            await s.stop()
    if reloader is not None:
        await reloader.stop()
    store.close()
    return 0


async def _serve(
    config: ReplicaConfig,
    bounds: http_bounds.HttpBounds | None = None,
    n: int = 1,
    lock: list[WriterLock] | None = None,
    takeover: bool = False,
    drain_s: float = upgrade.DRAIN_S,
    handover_timeout_s: float = upgrade.HANDOVER_TIMEOUT_S,
) -> int:
    from reads import watch

    cfg = config.worker
    lock = [] if lock is None else lock
    # Started by a hand-over: the old process holds the writer lock (its worker applies)
    # until this one serves; reads start at once, the worker once the lock is ours.
    # A waking read preempts the applier; the worker and readers started below inherit
    # this and the worker gives it up (replicator/sched.py).
    sched.favour_reads()
    if config.reader_cpus:
        # Before any reader or worker starts: they inherit it (the worker then moves to
        # its own CPUs, `--applier-cpus`).
        sched.pin(os.getpid(), config.reader_cpus)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tls.check_tokenless_listeners(
        [("kt", config.listeners.kt), ("memcached", _tcp_or_none(config.listeners.memcached))],
        config.allow_unauthenticated_reads,
    )
    tls.warn_plaintext(
        [
            ("read API", _tcp_or_none(config.listen)),
            ("replication", cfg.repl_listen),
            ("kt", config.listeners.kt),
            ("memcached", _tcp_or_none(config.listeners.memcached)),
        ],
        config.tls is not None,
    )
    os.makedirs(cfg.data_dir, exist_ok=True)
    sup = WorkerSupervisor(cfg, stop, config.log_level)
    pool: workers.ReaderPool | None = None
    reloader: tls.TlsReloader | None = None
    http: list[uvicorn.Config] = []
    if config.tls is not None:
        # SIGHUP, handled from the start (its default action would end the process): this
        # process's HTTPS context in place once it serves, and the worker's replication
        # contexts (it re-reads the files itself on the forwarded signal).
        reloader = tls.TlsReloader(
            config.tls,
            None,
            lambda: http[0].ssl if http else None,
            also=lambda: _forward_hup(sup, pool),
        )
        await reloader.start()
    if not takeover:
        await sup.start()
    # The worker bootstraps a missing store before streaming; reads start once it exists.
    while not takeover and not stop.is_set() and not _store_ready(cfg.data_dir):
        if sup.rebootstrap.is_set():
            break
        await asyncio.sleep(0.05)
    if stop.is_set():
        await sup.stop()
        return 0
    store = Store.open(cfg.data_dir, readonly=True)
    app, services, uv_config, sock = await _read_side(
        config, bounds or http_bounds.HttpBounds(), store, 0, n
    )
    server = _Server(uv_config)
    # uvicorn waits for every open response before stopping: watch streams must end.
    watch.end_streams_when(app, lambda: server.should_exit)
    http.append(uv_config)  # the SIGHUP reloader reloads its HTTPS context from now on
    helpers: list[asyncio.Task[None]] = []
    if n > 1:
        # Readers 1..n-1: this command again, as readers only (run_replica), same ports.
        metrics_dir = os.path.join(cfg.data_dir, "readers")
        workermetrics.clear(metrics_dir)
        pool = workers.ReaderPool(
            [sys.executable, "-m", "mercury", *sys.argv[1:]],
            n,
            stop_timeout=drain_s + 5,
            # After a hand-over: each reader starts on the old reader's sockets.
            first_sockets={i: handover.SOCKETS.take_group(i) for i in range(1, n)},
        )
        await pool.start()
        helpers.append(loop.create_task(workermetrics.keep_writing(metrics_dir, 0, stop)))
    logsetup.event(
        log,
        "start",
        role="replica",
        version=logsetup.mercury_version(),
        db_id=store.db_id,
        listen=_hp(config.listen),
        read_workers=n,
        kt_listen=_hp(config.listeners.kt),
        memcached_listen=_hp(config.listeners.memcached),
        repl_listen=_hp(cfg.repl_listen),
        sources=[f"{h}:{p}" for h, p in cfg.sources],
        seq=store.last_seq(),
        tls=config.tls is not None,
    )
    serving = loop.create_task(server.serve(sockets=[sock]))
    helpers.append(loop.create_task(handover.report_when_serving(server, stop)))
    if takeover:
        helpers.append(loop.create_task(_take_over_writer(cfg, sup, lock, stop)))

    async def hand_over(_succ: handover.Successor) -> None:
        # The new process serves on the same sockets: stop accepting, finish what is in
        # flight (bounded), and give the writer lock up at once so its worker applies.
        # An idle keep-alive connection may take the whole drain for one last request:
        # nothing waits for this process any more.
        server.drain(drain_s, drain_s)
        for s in services:
            if isinstance(s, TcpService):  # KT, memcached
                helpers.append(loop.create_task(s.drain(drain_s)))
        if pool is not None:
            pool.drain(signal.SIGQUIT)  # readers 1..n-1 drain alike
        await sup.stop()
        for held in lock:
            held.release()

    upgrader = handover.Upgrader(
        "replica",
        wait_for=handover.READY,
        on_go=hand_over,
        timeout=handover_timeout_s,
        # Readers 1..n-1's sockets too: the new executable's readers start on them.
        extra_sockets=pool.collect_sockets if pool is not None else None,
    )
    upgrader.install(loop)
    reboot = loop.create_task(sup.rebootstrap.wait())
    stopper = loop.create_task(stop.wait())
    await asyncio.wait({serving, reboot, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if not server.should_exit:
        server.should_exit = True
    with contextlib.suppress(Exception):
        await serving
    for t in (reboot, stopper):
        t.cancel()
    stop.set()
    for h in helpers:
        with contextlib.suppress(Exception):
            await h
    if pool is not None:
        await pool.stop()
        workermetrics.clear(os.path.join(cfg.data_dir, "readers"))
    for s in reversed(services):
        with contextlib.suppress(Exception):
            await s.stop()
    await sup.stop()
    if reloader is not None:
        await reloader.stop()
    logsetup.event(
        log,
        "stop",
        role="replica",
        seq=store.last_seq(),
        rebootstrap=sup.rebootstrap.is_set(),
        handed_to=upgrader.handed_to.pid if upgrader.handed_to is not None else None,
    )
    store.close()
    if sup.rebootstrap.is_set():
        _move_aside(cfg.data_dir)
        log.warning("re-executing to install the new snapshot")
        os.execv(sys.executable, [sys.executable, "-m", "mercury", *sys.argv[1:]])
    return 0


async def _take_over_writer(
    cfg: WorkerConfig, sup: WorkerSupervisor, lock: list[WriterLock], stop: asyncio.Event
) -> None:
    """After a hand-over: wait for the old process to give the writer lock up (it does once
    this process is ready), then start the replication worker with it."""
    from store.lock import StoreLockedError

    while not stop.is_set():
        try:
            held = WriterLock.acquire(cfg.data_dir, create=False)
        except StoreLockedError:
            await asyncio.sleep(0.02)
            continue
        lock.append(held)
        cfg.lock_fd = held.fd
        logsetup.event(log, "writer-lock", role="replica", how="handover")
        await sup.start()
        return


def _worker_refused(data_dir: str) -> dict[str, int]:
    """What the worker's replication source refused (from its status document)."""
    st = read_status(data_dir)
    return dict(st.refused) if st is not None else {}


def _tcp(addr: tuple[str, int] | UnixAddr) -> tuple[str, int]:
    # uvicorn's host/port are only named in its logs: the socket is ours.
    return ("unix", 0) if isinstance(addr, UnixAddr) else addr


def _tcp_or_none(addr: tuple[str, int] | UnixAddr | None) -> tuple[str, int] | None:
    """A TCP listener's address (a unix socket is local: not for the loopback checks)."""
    return None if addr is None or isinstance(addr, UnixAddr) else addr


def _hp(addr: tuple[str, int] | UnixAddr | None) -> str | None:
    if isinstance(addr, UnixAddr):
        return str(addr)
    return f"{addr[0]}:{addr[1]}" if addr is not None else None


def _store_ready(data_dir: str) -> bool:
    if not layout.exists(data_dir):
        return False
    st = read_status(data_dir)
    return st is not None and st.state not in ("starting", "bootstrapping", "bootstrap-waiting")


def _move_aside(data_dir: str) -> None:
    """Move the old store out of the way of a snapshot install (kept for post-mortems)."""
    old = os.path.join(data_dir, ".old")
    os.makedirs(old, exist_ok=True)
    for name in ("data.mdb", "lock.mdb"):
        src = os.path.join(data_dir, name)
        if os.path.exists(src):
            os.replace(src, os.path.join(old, name))


def run_replica(args: argparse.Namespace) -> int:
    """Run the replica until SIGTERM/SIGINT."""
    config = ReplicaConfig.from_args(args)
    from reads import watch

    bounds = http_bounds.HttpBounds.from_args(args)
    watch.set_limits(watch.WatchLimits.from_args(args))  # every reader's hub
    n = max(1, int(getattr(args, "read_workers", 1)))
    if n > 1 and any(isinstance(a, UnixAddr) for a in (config.listen, config.listeners.memcached)):
        # Readers share a port through SO_REUSEPORT, which a unix socket has no use for.
        raise ConfigError(
            "a unix socket listener serves with one reader process",
            hint="drop --read-workers, or listen on H:P",
        )
    index = workers.worker_index()
    if index > 0:
        # A reader started by reader 0's pool: no writer lock, no replication worker.
        eventloop.install()
        drain_s = getattr(args, "drain_s", upgrade.DRAIN_S)
        return asyncio.run(_serve_reader(config, bounds, index, n, drain_s))
    lock: list[WriterLock] = []
    takeover = handover.handed_over()
    if not takeover:
        # One writer per store: the parent takes the lock (a second replica on this
        # directory exits here, naming the holder) and its worker inherits it. A process
        # started by a hand-over takes it once the old one gives it up (`_serve`).
        lock.append(WriterLock.acquire(config.data_dir))
        config.worker.lock_fd = lock[0].fd
    eventloop.install()
    try:
        return asyncio.run(
            _serve(
                config,
                bounds,
                n,
                lock,
                takeover,
                drain_s=getattr(args, "drain_s", upgrade.DRAIN_S),
                handover_timeout_s=getattr(args, "handover_timeout_s", upgrade.HANDOVER_TIMEOUT_S),
            )
        )
    finally:
        for held in lock:
            held.release()
