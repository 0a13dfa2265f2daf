"""`mercury cache`'s process: the cache node's engine and its HTTP listener on one loop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal

import uvicorn

from cache.fasthttp import cache_fast_protocol
from cache.http import CacheApp
from cache.kt import cache_kt_service
from cache.memcached import cache_memcached_service
from cache.node import CacheNode, stop_task
from cache.store import CacheStore
from core import eventloop
from core.addr import parse_hostport
from core.errors import ConfigError
from mercury import tls
from net import http_bounds, uvicorn_http
from net.tcp import listener_limits
from net.tlsconf import TlsContexts
from reads import workers
from replicator.tcp import TcpTransport

log = logging.getLogger("mercury.cache")


def sources_of(values: list[str]) -> list[tuple[str, int]]:
    """--source values (repeated and/or comma-separated) as (host, port), in order."""
    out = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                out.append(parse_hostport(part.strip(), "--source"))
    return out


def run_cache(args: argparse.Namespace) -> int:
    """Run the cache node until SIGTERM/SIGINT."""
    if args.refuse_when_lagging and args.max_lag is None:
        raise ConfigError("--refuse-when-lagging needs --max-lag", hint="add --max-lag S")
    eventloop.install()
    asyncio.run(_serve(args))
    return 0


async def _serve(args: argparse.Namespace) -> None:
    files = tls.files_from_args(args)  # a cache follows as a replica does: its role
    contexts = TlsContexts(files) if files is not None else None
    store = CacheStore(args.data_dir, args.max_bytes)
    node = CacheNode(
        store,
        args.max_bytes,
        sources_of(args.source),
        TcpTransport(contexts),
        max_lag=args.max_lag,
    )
    app = CacheApp(node, refuse_when_lagging=args.refuse_when_lagging)
    # What exists now (imports, the entries loaded warm: long-lived, acyclic) is left out
    # of the collector's older-generation passes, which would otherwise walk it again and
    # again while serving.
    gc.collect()
    gc.freeze()
    host, port = parse_hostport(args.listen, "--listen")
    sock = workers.listen_socket(host, port, reuse_port=False)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        access_log=False,
        log_level="warning",
        lifespan="off",
        **tls.uvicorn_ssl(files),  # type: ignore[arg-type]
        # hits answered in the parser's callback (cache/fasthttp.py), the rest by the app
        **http_bounds.uvicorn_options(
            http_bounds.HttpBounds.from_args(args), cache_fast_protocol(app)
        ),
    )
    server = uvicorn_http.Server(config)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    memcached = None
    memcached_addr = None
    if args.memcached_listen:
        mhost, mport = memcached_addr = parse_hostport(args.memcached_listen, "--memcached-listen")
        memcached = cache_memcached_service(node, mhost, mport, listener_limits(args))
        await memcached.start()
    kt = None
    kt_addr = None
    if args.kt_listen:
        khost, kport = kt_addr = parse_hostport(args.kt_listen, "--kt-listen")
        # KT's RESTful /DB/key and RPC DB= name database 0 by the data directory's name
        kt = cache_kt_service(
            node,
            os.path.basename(os.path.normpath(args.data_dir)).encode(),
            khost,
            kport,
            refuse_when_lagging=args.refuse_when_lagging,
            limits=listener_limits(args),
            db_aliases=tuple(a.encode() for a in args.kt_db_alias),
        )
        await kt.start()
    tls.warn_plaintext(
        [
            ("--listen", (host, port)),
            ("--memcached-listen", memcached_addr),
            ("--kt-listen", kt_addr),
        ],
        files is not None,
    )
    reloader = None
    if files is not None:
        reloader = tls.TlsReloader(files, contexts, lambda: config.ssl)
        await reloader.start()
    following = loop.create_task(node.run())
    serving = loop.create_task(server.serve(sockets=[sock]))
    stopper = loop.create_task(stop.wait())
    log.info("cache node serving on %s:%d", host, port)
    try:
        await asyncio.wait({serving, stopper, following}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        await serving
    finally:
        stopper.cancel()
        if reloader is not None:
            await reloader.stop()
        for svc in (memcached, kt):
            if svc is not None:
                with contextlib.suppress(Exception):
                    await svc.stop()
        await stop_task(following)
        with contextlib.suppress(Exception):
            node.close()
