"""The local development topology `make run` starts, as data.

`docker-compose.yml` runs the same commands with the same flags (plus a tier-2 replica and a
consumer node); `tests/test_compose.py` checks the two agree, so the file never drifts from
what developers actually run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Node:
    """One process of the topology: a `mercury` subcommand and its arguments."""

    name: str
    command: str
    data_dir: str
    flags: tuple[tuple[str, str], ...]

    def argv(self) -> list[str]:
        """Arguments after `mercury`."""
        out = [self.command, self.data_dir]
        for flag, value in self.flags:
            out += [flag, value]
        return out

    def flag(self, name: str) -> str:
        """Value of `name` (KeyError when absent)."""
        return dict(self.flags)[name]


@dataclass(frozen=True)
class Ports:
    """The loopback ports of the local topology (`make run` takes each from a flag or an
    environment variable, see `mercury/devrun.py`)."""

    root: int = 8080
    root_repl: int = 7070
    root_kt: int = 1978
    replica: int = 8081
    replica_repl: int = 7071
    replica_kt: int = 1979
    replica_memcached: int = 11211


def local(ports: Ports = Ports(), var: str = "var") -> tuple[Node, Node]:
    """The root and its replica on `ports`, their stores under `var`."""
    lo = "127.0.0.1"
    root = Node(
        "root",
        "root",
        f"{var}/root",
        (
            ("--listen", f"{lo}:{ports.root}"),
            ("--repl-listen", f"{lo}:{ports.root_repl}"),
            ("--kt-listen", f"{lo}:{ports.root_kt}"),
        ),
    )
    replica = Node(
        "replica",
        "replica",
        f"{var}/replica",
        (
            ("--source", f"{lo}:{ports.root_repl}"),
            ("--listen", f"{lo}:{ports.replica}"),
            ("--repl-listen", f"{lo}:{ports.replica_repl}"),
            ("--kt-listen", f"{lo}:{ports.replica_kt}"),
            ("--memcached-listen", f"{lo}:{ports.replica_memcached}"),
        ),
    )
    return root, replica


ROOT, REPLICA = LOCAL = local()

DEMO_PRODUCER = "demo"
DEMO_KEYSPACE = "demo/"
