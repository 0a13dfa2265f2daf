"""The local development topology `make run` starts, as data.

`docker-compose.yml` runs the secure variant's commands with the same flags (plus a tier-2
replica and a consumer node); `tests/test_compose.py` checks the two agree, so the file
never drifts from what developers actually run.

The secure variant (`local(..., secure=True)`, ``MERCURY_SECURE=1 make run``) gives every
node its certificate (`mercury certs`: `<certs>/<node>.crt` and `.key`, `<certs>/ca.crt`),
so HTTP is HTTPS and replication mutual TLS, and asks every HTTP read for a token
(`--read-auth`). The KT and memcached listeners stay on loopback: they carry no token.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Node:
    """One process of the topology: a `mercury` subcommand and its arguments."""

    name: str
    command: str
    data_dir: str
    #: (flag, value); a value of None is a flag without one (`--read-auth`).
    flags: tuple[tuple[str, str | None], ...]

    def argv(self) -> list[str]:
        """Arguments after `mercury`."""
        out = [self.command, self.data_dir]
        for flag, value in self.flags:
            out += [flag] if value is None else [flag, value]
        return out

    def flag(self, name: str) -> str:
        """Value of `name` (KeyError when absent, "" for a flag without a value)."""
        return dict(self.flags)[name] or ""

    @property
    def scheme(self) -> str:
        """``https`` when the node has a certificate, else ``http``."""
        return "https" if "--tls-cert" in dict(self.flags) else "http"


@dataclass(frozen=True)
class Ports:
    """The loopback ports of the local topology (`make run` takes each from a flag or an
    environment variable, see `mercury/dev/run.py`)."""

    root: int = 8080
    root_repl: int = 7070
    root_kt: int = 1978
    replica: int = 8081
    replica_repl: int = 7071
    replica_kt: int = 1979
    replica_memcached: int = 11211
    #: The HA variant only: the second and third root candidates and the local etcd member.
    root_b: int = 8082
    root_b_repl: int = 7072
    root_c: int = 8083
    root_c_repl: int = 7073
    etcd: int = 2379
    etcd_peer: int = 2380
    #: The cache node of ``make run --cache`` (`cache_node`).
    cache: int = 8084
    #: Its KT listener (KT readers of the cache: `mercury cache --kt-listen`).
    cache_kt: int = 1980
    #: The filtered replica of ``make run --filtered PREFIX`` (`filtered_replica`).
    filtered: int = 8085


def secure_flags(node: str, certs: str) -> tuple[tuple[str, str | None], ...]:
    """TLS with `node`'s certificate from `certs`, and read tokens."""
    return (
        ("--tls-cert", f"{certs}/{node}.crt"),
        ("--tls-key", f"{certs}/{node}.key"),
        ("--tls-ca", f"{certs}/ca.crt"),
        ("--read-auth", None),
    )


def local(ports: Ports = Ports(), var: str = "var", *, secure: bool = False) -> tuple[Node, Node]:
    """The root and its replica on `ports`, their stores under `var` (with `secure`, their
    certificates under `var`/certs)."""
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
    if not secure:
        return root, replica
    certs = f"{var}/certs"
    return (
        replace(root, flags=root.flags + secure_flags(root.name, certs)),
        replace(replica, flags=replica.flags + secure_flags(replica.name, certs)),
    )


def filtered_replica(ports: Ports, var: str, prefix: str) -> Node:
    """The filtered replica ``MERCURY_FILTERED=PREFIX make run`` adds (plain mode only): it
    holds the keys under PREFIX, following the replica, then the root (docs/replication.md,
    "Filtered replicas")."""
    lo = "127.0.0.1"
    return Node(
        "filtered",
        "replica",
        f"{var}/filtered",
        (
            ("--source", f"{lo}:{ports.replica_repl}"),
            ("--source", f"{lo}:{ports.root_repl}"),
            ("--keyspace", prefix),
            ("--listen", f"{lo}:{ports.filtered}"),
        ),
    )


#: The election name of the HA variant's candidates.
def cache_node(ports: Ports = Ports(), var: str = "var") -> Node:
    """The cache node ``MERCURY_CACHE=1 make run`` adds (plain mode only): it follows the
    replica's invalidation stream, the root's when the replica is down (docs/replication.md,
    "Cache nodes")."""
    lo = "127.0.0.1"
    return Node(
        "cache",
        "cache",
        f"{var}/cache",
        (
            ("--source", f"{lo}:{ports.replica_repl},{lo}:{ports.root_repl}"),
            ("--max-bytes", "64MiB"),
            ("--listen", f"{lo}:{ports.cache}"),
            ("--kt-listen", f"{lo}:{ports.cache_kt}"),
            ("--max-lag", "10"),
        ),
    )


HA_GROUP = "local-root"


def local_ha(ports: Ports = Ports(), var: str = "var") -> tuple[tuple[Node, ...], Node]:
    """The HA variant (``MERCURY_HA=1 make run``): three root candidates, the production
    shape (docs/operations.md: with one candidate down, the leader still has a standby to
    confirm its writes, and the cluster survives a second failure without losing an
    acknowledged write), `root-a` (whose store `make run` initialises), `root-b` and
    `root-c` (empty: they bootstrap from the leader), elected through the etcd member on
    `ports.etcd`, each with its gateway and replication listener; and the replica listing
    all three as sources (it streams from whichever leads) with every read listener."""
    lo = "127.0.0.1"
    replica = local(ports, var)[1]
    etcd = f"http://{lo}:{ports.etcd}"

    def candidate(name: str, http: int, repl: int) -> Node:
        return Node(
            name,
            "root",
            f"{var}/{name}",
            (
                ("--listen", f"{lo}:{http}"),
                ("--repl-listen", f"{lo}:{repl}"),
                ("--ha-etcd", etcd),
                ("--ha-group", HA_GROUP),
                ("--advertise-url", f"http://{lo}:{http}"),
                ("--advertise-repl", f"{lo}:{repl}"),
            ),
        )

    cands = (
        candidate("root-a", ports.root, ports.root_repl),
        candidate("root-b", ports.root_b, ports.root_b_repl),
        candidate("root-c", ports.root_c, ports.root_c_repl),
    )
    others = tuple(fv for fv in replica.flags if fv[0] != "--source")
    sources = tuple(("--source", c.flag("--advertise-repl")) for c in cands)
    return cands, replace(replica, flags=sources + others)


ROOT, REPLICA = LOCAL = local()
SECURE_ROOT, SECURE_REPLICA = local(secure=True)

DEMO_PRODUCER = "demo"
DEMO_KEYSPACE = "demo/"
#: The consumer the secure `make run` creates, reading the demo keyspace on every node.
DEMO_CONSUMER = "demo-reader"
