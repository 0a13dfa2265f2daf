"""One logging setup for every Mercury process: JSON lines on stderr.

The root, the replica and the replica's replication worker (`mercury/worker.py`) all call
`setup` before anything logs, and uvicorn is run with ``log_config=None`` so its loggers
propagate here too: every line a process writes is one JSON object with ``ts``, ``level``,
``logger`` and either ``msg`` or the fields of a message that is itself a JSON object
(the batcher's and the lifecycle events' structured lines).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import orjson

LEVELS = ("debug", "info", "warning", "error")


def mercury_version() -> str:
    """The installed package's version ("unknown" when run from an uninstalled tree)."""
    try:
        return version("mercury")
    except PackageNotFoundError:  # pragma: no cover - the venv installs the project
        return "unknown"


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and exception text)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
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
        return orjson.dumps(doc, default=str).decode()


def setup(level: str) -> None:
    """JSON lines on stderr from every logger of this process, at `level` and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at info (the CLI's client commands would print a line per
    # call): its lines appear only at debug.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "debug" else logging.WARNING)
    logging.captureWarnings(True)


def event(logger: logging.Logger, name: str, **fields: Any) -> None:
    """Log one structured lifecycle line (``{"event": name, ...}``) at info level."""
    logger.info(orjson.dumps({"event": name, **fields}, default=str).decode())


class StopLog:
    """A `core.service.Service` that logs the ``stop`` event when the process's lifespan
    stops it. Listed first, it is stopped last: after the open batch is committed and
    every other service stopped (uvicorn re-raises SIGTERM once its server has shut down,
    so code after `Server.run` never runs)."""

    name = "stop-log"

    def __init__(self, logger: logging.Logger, fields: Callable[[], dict[str, Any]]) -> None:
        self._log = logger
        self._fields = fields

    async def start(self) -> None:
        """Nothing to start."""

    async def stop(self) -> None:
        """Log ``{"event": "stop", ...fields()}``."""
        event(self._log, "stop", **self._fields())
