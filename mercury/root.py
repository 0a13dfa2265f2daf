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

from gateway.app import create_app
from gateway.fastpath import FastPath
from mercury import gctune
from mercury.settings import RootConfig
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


def run_root(args: argparse.Namespace) -> int:
    """Run the root until SIGTERM/SIGINT; the open batch is committed before exit."""
    # Imported here so `mercury --help` does not load the other components.
    from reads import wiring as reads_wiring
    from replicator import wiring as repl_wiring

    setup_logging(args.log_level)
    cfg = RootConfig.from_args(args)
    # The commit thread and the event loop share the GIL; with the default 5 ms switch
    # interval a busy loop (a producer flooding) stretches every commit by several 5 ms
    # waits, which delays every producer's acks. A shorter interval keeps commits short.
    sys.setswitchinterval(cfg.switch_interval_s)
    gctune.tune_for_batches()
    host, port = cfg.listen
    store = Store.open(cfg.data_dir, sync=cfg.sync)
    try:
        services = [
            *repl_wiring.root_services(store, cfg.source),
            *reads_wiring.root_services(store, cfg.listeners),
            RetentionService(store, cfg.retention),
        ]
        app = create_app(cfg.gateway, store, services)
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
