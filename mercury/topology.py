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


ROOT = Node(
    "root",
    "root",
    "var/root",
    (
        ("--listen", "127.0.0.1:8080"),
        ("--repl-listen", "127.0.0.1:7070"),
        ("--kt-listen", "127.0.0.1:1978"),
    ),
)
REPLICA = Node(
    "replica",
    "replica",
    "var/replica",
    (
        ("--source", "127.0.0.1:7070"),
        ("--listen", "127.0.0.1:8081"),
        ("--repl-listen", "127.0.0.1:7071"),
        ("--kt-listen", "127.0.0.1:1979"),
        ("--memcached-listen", "127.0.0.1:11211"),
    ),
)
LOCAL = (ROOT, REPLICA)

DEMO_PRODUCER = "demo"
DEMO_KEYSPACE = "demo/"
