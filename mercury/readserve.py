"""`python -m mercury.readserve DATA_DIR ...`: serve the read side of an existing store.

A standalone read server (HTTP read API plus the optional KT and memcached listeners) over
a store that another process writes — exactly a replica's situation, where the applier is
one process and readers may be others. Tests and `bench/read_under_write.py` use it; the
`mercury replica` command embeds the same app and services, and its HTTP listener is
bounded alike (`net/http_bounds.py`: the same ``--http-*`` flags and defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from core import eventloop
from core.addr import parse_hostport
from mercury.listeners import ListenerSettings, replica_services, root_services
from net import http_bounds, uvicorn_http
from net.tcp import TcpService, add_listener_flags, listener_limits
from net.uvicorn_http import HttpProtocol
from reads import watch, workermetrics, workers
from reads.auth import AclTokenIndex, ReadAuth
from reads.fasthttp import fast_read_protocol
from reads.http_app import create_read_app
from store.store import Store


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command line of the standalone read server."""
    p = argparse.ArgumentParser(prog="python -m mercury.readserve", description=__doc__)
    p.add_argument("data_dir", help="an existing store directory")
    p.add_argument("--listen", default="127.0.0.1:8081", help="HTTP read API H:P")
    p.add_argument("--kt-listen", default=None, help="Kyoto Tycoon protocol listener H:P")
    p.add_argument("--memcached-listen", default=None, help="memcached text protocol H:P")
    add_listener_flags(p)
    http_bounds.add_flags(p)  # the HTTP listener's bounds, as `mercury replica`'s
    watch.add_flags(p)
    p.add_argument("--role", default="replica", choices=("replica", "consumer", "root"))
    p.add_argument(
        "--read-auth",
        action="store_true",
        help="reads need a producer's or consumer's token and see only its keyspaces",
    )
    p.add_argument(
        "--read-workers",
        type=int,
        default=1,
        metavar="N",
        help="serve with N processes sharing the listeners (SO_REUSEPORT; default 1)",
    )
    p.add_argument(
        "--no-fast-path",
        action="store_true",
        help="answer point gets through the ASGI app too (tests compare both paths)",
    )
    p.add_argument(
        "--noop-path",
        default=None,
        help="also answer GET on this path with a fixed body from raw ASGI (benchmarks)",
    )
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    """Run until SIGTERM/SIGINT."""
    n = max(1, int(args.read_workers))
    index = workers.worker_index()
    store = Store.open(args.data_dir, readonly=n > 1)
    watch.set_limits(watch.WatchLimits.from_args(args))
    app = create_read_app(store, role=args.role, status=dict, read_auth=args.read_auth)
    tokens = AclTokenIndex(store) if args.read_auth else None
    guarded: Any = ReadAuth(app, tokens) if tokens is not None else app
    asgi = guarded if args.noop_path is None else NoopWrapper(guarded, args.noop_path.encode())
    listeners = ListenerSettings(
        kt=parse_hostport(args.kt_listen, "--kt-listen") if args.kt_listen else None,
        memcached=(
            parse_hostport(args.memcached_listen, "--memcached-listen")
            if args.memcached_listen
            else None
        ),
        limits=listener_limits(args),
        reuse_port=n > 1,
    )
    wire = root_services if args.role == "root" else replica_services
    services = wire(store, listeners)
    for s in services:
        if isinstance(s, TcpService):
            s.reuse_port = n > 1
        await s.start()
    host, port = parse_hostport(args.listen, "--listen")
    base = HttpProtocol if args.no_fast_path else fast_read_protocol(store, tokens)
    sock = workers.listen_socket(host, port, reuse_port=n > 1)
    config = uvicorn.Config(
        asgi,
        host=host,
        port=port,
        access_log=False,
        log_level="warning",
        lifespan="off",
        # idle/header timeouts, a header size cap and a connection cap, as on a replica
        **http_bounds.uvicorn_options(http_bounds.HttpBounds.from_args(args), base),
    )
    server = uvicorn_http.Server(config)  # our loop handlers set `should_exit`
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    helpers: list[asyncio.Task[None]] = []
    pool: workers.ReaderPool | None = None
    if n > 1:
        metrics_dir = os.path.join(args.data_dir, "readers")
        app.state.readers = (metrics_dir, index, n)
        helpers.append(loop.create_task(workermetrics.keep_writing(metrics_dir, index, stop)))
        if index == 0:
            workermetrics.clear(metrics_dir)
            pool = workers.ReaderPool([sys.executable, "-m", "mercury.readserve", *args.argv], n)
            await pool.start()
        else:
            helpers.append(loop.create_task(workers.exit_with_parent(stop)))
    serving = loop.create_task(server.serve(sockets=[sock]))
    stopper = loop.create_task(stop.wait())
    try:
        await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        await serving
    finally:
        stop.set()
        stopper.cancel()
        for t in helpers:
            with contextlib.suppress(Exception):
                await t
        if pool is not None:
            await pool.stop()
            workermetrics.clear(os.path.join(args.data_dir, "readers"))
        for s in reversed(services):
            with contextlib.suppress(Exception):
                await s.stop()
        store.close()


class NoopWrapper:
    """Raw ASGI: GET `path` answers a fixed 2-byte body; anything else goes to `app`.

    The benchmark's yardstick: the cheapest possible answer on the same server and event
    loop, to compare point reads against.
    """

    def __init__(self, app: object, path: bytes) -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: dict[str, object], receive: object, send: object) -> None:
        if scope["type"] == "http" and scope.get("raw_path") == self.path:
            await send(  # type: ignore[operator]
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"application/octet-stream"),
                        (b"content-length", b"2"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": b"v0"})  # type: ignore[operator]
            return
        await self.app(scope, receive, send)  # type: ignore[operator]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what other readers run
    eventloop.install()
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
