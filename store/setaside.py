"""Store copies set aside inside a data directory, and removing them.

Two things move a node's store files aside instead of deleting them, so an operator can
still inspect what was there: an HA standby whose history differs from its new leader's
(``DATA_DIR/.diverged-<ms>/``, `ha/standby.py`) and `mercury restore` replacing a store
(``DATA_DIR/.replaced-<ms>/``). Each holds a whole ``data.mdb``: left alone they fill the
disk. `/v1/status` lists them (`node_facts`) and `mercury prune-aside` removes them
(`prune`). ``<ms>`` is the wall-clock time the copy was set aside, in milliseconds.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from store import layout

#: Name prefixes of set-aside directories (a standby's diverged history, a replaced store).
PREFIXES = (".diverged-", ".replaced-")
REPLACED = ".replaced-"


@dataclass(frozen=True)
class SetAside:
    """One set-aside directory: its name in DATA_DIR, when it was set aside (ms since the
    epoch, from its name) and the bytes its files hold."""

    name: str
    set_aside_ms: int
    bytes: int

    def age_seconds(self, now_ms: int) -> float:
        """Seconds since it was set aside (never negative)."""
        return max(0.0, (now_ms - self.set_aside_ms) / 1000.0)

    def to_dict(self, now_ms: int) -> dict[str, Any]:
        """Its `/v1/status` entry."""
        return {"name": self.name, "bytes": self.bytes, "age_seconds": self.age_seconds(now_ms)}


def _stamp(name: str) -> int | None:
    """The ms stamp of a set-aside directory's name, None when `name` is not one."""
    for prefix in PREFIXES:
        if name.startswith(prefix) and name[len(prefix) :].isdigit():
            return int(name[len(prefix) :])
    return None


def _size(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                continue  # removed meanwhile
    return total


def listing(data_dir: str) -> list[SetAside]:
    """The set-aside directories of `data_dir`, oldest first ([] when it has none or
    does not exist)."""
    try:
        names = os.listdir(data_dir)
    except OSError:
        return []
    out = []
    for name in names:
        stamp = _stamp(name)
        path = os.path.join(data_dir, name)
        if stamp is not None and os.path.isdir(path) and not os.path.islink(path):
            out.append(SetAside(name, stamp, _size(path)))
    return sorted(out, key=lambda s: (s.set_aside_ms, s.name))


def new_dir(data_dir: str, prefix: str, now_ms: int | None = None) -> str:
    """Create and return a new set-aside directory ``DATA_DIR/<prefix><ms>`` (0700)."""
    ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    while True:
        path = os.path.join(data_dir, f"{prefix}{ms}")
        try:
            os.mkdir(path, layout.DIR_MODE)
            return path
        except FileExistsError:
            ms += 1  # two in one millisecond: the next name


def prune(data_dir: str, older_than_s: float = 0.0, now_ms: int | None = None) -> list[SetAside]:
    """Remove the set-aside directories of `data_dir` set aside more than `older_than_s`
    seconds ago; return what was removed."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    gone = []
    for s in listing(data_dir):
        if s.age_seconds(now) >= older_than_s:
            shutil.rmtree(os.path.join(data_dir, s.name))
            gone.append(s)
    return gone


def node_facts(
    data_dir: str, first_seq: int, oldest_us: int | None, now_us: int | None = None
) -> dict[str, Any]:
    """The retention and set-aside facts of a node's `/v1/status`: the first retained log
    seq, the age of the oldest retained record (seconds; None for an empty log) and the
    set-aside directories."""
    now = time.time_ns() // 1000 if now_us is None else now_us
    age = None if oldest_us is None else max(0.0, (now - oldest_us) / 1e6)
    return {
        "log_first_seq": first_seq,
        "log_retained_seconds": age,
        "set_aside": [s.to_dict(now // 1000) for s in listing(data_dir)],
    }


#: JSON Schema of the `node_facts` fields (the `/v1/status` documents of every node kind).
NODE_FACTS_SCHEMA: dict[str, Any] = {
    "log_first_seq": {
        "type": "integer",
        "minimum": 0,
        "description": "first seq the log retains: a replica below it must bootstrap",
    },
    "log_retained_seconds": {
        "anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}],
        "description": "age of the oldest retained log record (null: the log is empty)",
    },
    "set_aside": {
        "type": "array",
        "description": "store copies set aside in DATA_DIR (`mercury prune-aside` removes them)",
        "items": {
            "type": "object",
            "required": ["name", "bytes", "age_seconds"],
            "properties": {
                "name": {"type": "string"},
                "bytes": {"type": "integer", "minimum": 0},
                "age_seconds": {"type": "number", "minimum": 0},
            },
        },
    },
}
