"""``python -m mercury.worker --log-level L CONFIG_JSON``: the replica's replication worker
with the one logging setup of every Mercury process (`mercury/logsetup.py`).

`mercury/replica.py` starts this instead of ``python -m replicator.worker`` so the worker's
lines are JSON like its parent's; the worker itself is `replicator.worker.main`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from mercury import logsetup

log = logging.getLogger("mercury.replication.worker")


def main(argv: Sequence[str] | None = None) -> int:
    """Set up logging, log start and stop, run the worker."""
    p = argparse.ArgumentParser(prog="python -m mercury.worker")
    p.add_argument("--log-level", default="info", choices=logsetup.LEVELS)
    p.add_argument("config", help="the worker's configuration (JSON)")
    args = p.parse_args(argv)
    logsetup.setup(args.log_level)
    from replicator.worker import WorkerConfig
    from replicator.worker import main as worker_main

    cfg = WorkerConfig.from_json(args.config)
    logsetup.event(
        log,
        "start",
        version=logsetup.mercury_version(),
        data_dir=cfg.data_dir,
        sources=[f"{h}:{p}" for h, p in cfg.sources],
        repl_listen=f"{cfg.repl_listen[0]}:{cfg.repl_listen[1]}" if cfg.repl_listen else None,
    )
    code = worker_main([sys.argv[0], args.config])
    logsetup.event(log, "stop", exit_code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
