"""`mercury root`: the root process — store writer, gateway, replication source, readers.

Thin wiring only: open the store (durable: fsync on every commit), ask the replication and
reads components for the services they run on the root, build the gateway app with them,
and run it under uvicorn (uvloop + httptools, no access log: per-request logging costs a
third of the throughput; the batcher logs one structured line per batch instead).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

import orjson
import uvicorn

from core.addr import parse_hostport
from gateway.app import create_app
from gateway.fastpath import FastPath
from gateway.settings import Settings
from mercury import gctune
from mercury.retention_flags import policy_from_args
from store.retention import RetentionService
from store.store import Store


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception text)."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        msg = record.getMessage()
        if msg.startswith("{"):
            try:
                doc.update(orjson.loads(msg))
            except orjson.JSONDecodeError:
                doc["msg"] = msg
        else:
            doc["msg"] = msg
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def setup_logging(level: str) -> None:
    """Structured (JSON lines) logs on stderr for Mercury's loggers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger("mercury")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Gateway settings from `mercury root`'s arguments."""
    return Settings(
        batch_window_ms=float(args.batch_window_ms),
        batch_max_ops=int(args.batch_max_ops),
        batch_max_bytes=int(args.batch_max_bytes),
        consumer_nodes=tuple(args.consumer_node or ()),
        fast_path=not args.no_fast_path,
    )


def run_root(args: argparse.Namespace) -> int:
    """Run the root until SIGTERM/SIGINT; the open batch is committed before exit."""
    # Imported here so `mercury --help` does not load the other components.
    from reads import wiring as reads_wiring
    from replicator import wiring as repl_wiring

    setup_logging(args.log_level)
    # The commit thread and the event loop share the GIL; with the default 5 ms switch
    # interval a busy loop (a producer flooding) stretches every commit by several 5 ms
    # waits, which delays every producer's acks. A shorter interval keeps commits short.
    sys.setswitchinterval(args.switch_interval_ms / 1000.0)
    gctune.tune_for_batches()
    host, port = parse_hostport(args.listen, "--listen")
    parse_hostport(args.repl_listen, "--repl-listen")
    if args.kt_listen:
        parse_hostport(args.kt_listen, "--kt-listen")
    store = Store.open(args.data_dir, sync=not args.no_sync)
    try:
        services = [
            *repl_wiring.root_services(store, args),
            *reads_wiring.root_services(store, args),
            RetentionService(store, policy_from_args(args)),
        ]
        app = create_app(settings_from_args(args), store, services)
        config = uvicorn.Config(
            FastPath(app),
            host=host,
            port=port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level="warning",
            lifespan="on",
            timeout_keep_alive=30,
        )
        logging.getLogger("mercury.gateway").info(
            orjson.dumps({"event": "start", "listen": args.listen, "db_id": store.db_id}).decode()
        )
        uvicorn.Server(config).run()
    finally:
        store.close()
    return 0
