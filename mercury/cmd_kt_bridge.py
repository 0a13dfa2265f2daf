"""`mercury kt-bridge`: follow a Kyoto Tycoon server's update log into Mercury (see
`kt/bridge.py` and docs/kt-compat.md)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any

from core.addr import parse_hostport
from core.errors import ConfigError
from kt.bridge import Bridge, BridgeState, KtBridgeError, Options, Quarantine, import_db
from mercury_client import Client, MercuryClientError


def register(sub: Any) -> None:
    """Add `mercury kt-bridge` to the `mercury` parser."""
    p = sub.add_parser(
        "kt-bridge",
        help="follow a Kyoto Tycoon server's update log and write its changes to Mercury",
        description="Connect to a running ktserver (started with -ulog DIR -sid N) as a "
        "replication slave and write every set/remove/clear of one of its databases through "
        "the gateway as producer batches. The state file keeps the KT timestamp reached, so "
        "a restarted bridge resumes without gaps, and a batch interrupted by a crash is "
        "replayed with the same Idempotency-Key. --import copies the database once instead.",
    )
    p.add_argument("--kt", required=True, metavar="H:P", help="the ktserver to follow")
    p.add_argument("--url", required=True, help="the root's gateway URL (writes)")
    p.add_argument("--token-file", required=True, help="file holding the producer's token")
    p.add_argument(
        "--state",
        required=True,
        metavar="FILE",
        help="the bridge's cursor file (created when absent; one per followed database)",
    )
    p.add_argument(
        "--read-url",
        help="a replica or consumer node; needed to follow a KT clear (lists the keys to delete)",
    )
    p.add_argument("--prefix", default="", help="prepended to every KT key (default none)")
    p.add_argument("--db", type=int, default=0, metavar="N", help="KT database index (default 0)")
    p.add_argument(
        "--sid",
        type=int,
        default=65535,
        help="the bridge's server id; must differ from the master's -sid (default 65535)",
    )
    p.add_argument(
        "--persistent",
        action="store_true",
        help="the KT database was opened with ktopts=p (values carry no expiry prefix)",
    )
    p.add_argument("--window-ms", type=float, default=200.0, help="batch window (default 200)")
    p.add_argument("--batch-ops", type=int, default=1000, help="changes per batch (default 1000)")
    p.add_argument(
        "--metrics-listen",
        metavar="H:P",
        help="serve Prometheus metrics (GET /metrics) on this address (default: none)",
    )
    p.add_argument("--ca", help="CA bundle (PEM) that verifies the gateway's TLS certificate")
    p.add_argument(
        "--skip-refused",
        metavar="FILE",
        help="record each change of a KT key Mercury cannot hold (over 500 bytes with the "
        "prefix) in FILE (JSON lines) and go on, instead of stopping at it",
    )
    p.add_argument(
        "--import",
        dest="import_once",
        action="store_true",
        help="copy the whole KT database once (RPC cursor), record the cursor, and exit",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        token = Path(args.token_file).read_text().strip()
    except OSError as err:
        raise ConfigError(f"cannot read --token-file: {err}") from err
    if not 0 <= args.sid <= 65535 or not 0 <= args.db <= 65535:
        raise ConfigError("--sid and --db must be between 0 and 65535")
    opts = Options(
        kt=parse_hostport(args.kt, "--kt"),
        prefix=args.prefix.encode(),
        dbid=args.db,
        sid=args.sid,
        persistent=args.persistent,
        window_s=args.window_ms / 1000.0,
        batch_ops=args.batch_ops,
    )
    state = BridgeState.load(Path(args.state))
    quarantine = Quarantine(Path(args.skip_refused)) if args.skip_refused else None
    if args.metrics_listen and not args.import_once:
        _serve_metrics(*parse_hostport(args.metrics_listen, "--metrics-listen"))
    client = Client(
        args.url,
        token,
        read_url=args.read_url,
        verify=args.ca or True,
        batch_ops=args.batch_ops,
    )
    with client:
        if args.import_once:
            try:
                n = import_db(opts, client, state, quarantine)
            except MercuryClientError as err:
                raise KtBridgeError(f"the root refused the import: {err}") from err
            print(f"imported {n} records; cursor {state.ts}")
            return 0
        stopping: list[int] = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, _f: stopping.append(s))
        bridge = Bridge(
            opts,
            client,
            state,
            can_clear=args.read_url is not None,
            stop=lambda: bool(stopping),
            quarantine=quarantine,
        )
        bridge.run()
        return 0


#: A scrape endpoint: a few Prometheus servers, never a crowd.
METRICS_MAX_CONNECTIONS = 64


def _serve_metrics(host: str, port: int) -> None:
    """`/metrics` on `host:port`, on the listener layer every other HTTP face uses (its
    connection cap, deadlines and eviction: `net.http_bounds`), in a thread beside the
    bridge's loop. prometheus_client's own server starts a thread per connection with no
    cap and no deadline, which one client could hold or multiply."""
    import threading

    import prometheus_client
    import uvicorn

    from net import http_bounds, uvicorn_http

    bounds = http_bounds.HttpBounds(max_connections=METRICS_MAX_CONNECTIONS)
    config = uvicorn.Config(
        prometheus_client.make_asgi_app(),
        host=host,
        port=port,
        lifespan="off",
        log_config=None,
        access_log=False,
        **http_bounds.uvicorn_options(bounds),
    )
    server = uvicorn_http.Server(config)
    threading.Thread(target=server.run, name="metrics", daemon=True).start()
