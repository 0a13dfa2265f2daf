"""Root candidates on a real etcd, real processes: start, find the leader, kill, write.

Shared by tests/ha and bench/failover.py. Every process is started through `Procs` (own
process group, stopped by PID).
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from store.store import Store
from testkit.logged import records
from testkit.procs import Procs, free_port, run_mercury
from testkit.wait import wait_until

DEADLINE_S = 60.0


@dataclass
class Node:
    """One candidate: its directory, ports and process."""

    name: str
    data_dir: Path
    http_port: int
    repl_port: int
    proc: subprocess.Popen[bytes] | None = None
    #: this node's etcd URLs when not the cluster's (a fault proxy in between)
    etcd_urls: str | None = None
    #: the CA to verify HTTPS with (None: plain HTTP)
    https: ssl.SSLContext | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.https is not None else "http"
        return f"{scheme}://127.0.0.1:{self.http_port}"

    def status(self) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(self.url + "/v1/status", timeout=1.0, verify=self.https or True)
            if r.status_code == 200:
                return r.json()  # type: ignore[no-any-return]
        return None


@dataclass
class Cluster:
    """Candidates of one group on one etcd."""

    procs: Procs
    base: Path
    etcd_urls: str
    n: int = 2
    ttl_s: int = 2
    sync_standbys: int = 1
    extra: tuple[str, ...] = ()
    group: str = "g"
    https: ssl.SSLContext | None = None
    nodes: list[Node] = field(default_factory=list)
    admin: str = ""
    token: str = ""

    def start(self) -> None:
        """Init the first node's store, start every candidate, create producer `p`."""
        for i in range(len(self.nodes), self.n):  # those the caller did not lay out
            self.nodes.append(Node(f"n{i}", self.base / f"n{i}", free_port(), free_port()))
        for node in self.nodes:
            node.https = self.https
        res = run_mercury("init", str(self.nodes[0].data_dir))
        assert res.returncode == 0, res.stderr
        self.admin = (self.nodes[0].data_dir / "admin.token").read_text().strip()
        self.start_node(self.nodes[0])
        leader = self.wait_leader()
        h = {"Authorization": f"Bearer {self.admin}"}
        v = self.https or True
        r = httpx.put(
            f"{leader.url}/v1/admin/producers/p", json={"keyspaces": ["k/"]}, headers=h, verify=v
        )
        assert r.status_code in (200, 201), r.text
        r = httpx.post(f"{leader.url}/v1/admin/producers/p/tokens", headers=h, verify=v)
        assert r.status_code == 201, r.text
        self.token = r.json()["token"]
        for node in self.nodes[1:]:
            self.start_node(node)
        self.wait_standbys(self.n - 1)

    def argv(self, node: Node) -> list[str]:
        return [
            "root",
            str(node.data_dir),
            "--listen",
            f"127.0.0.1:{node.http_port}",
            "--repl-listen",
            f"127.0.0.1:{node.repl_port}",
            "--ha-etcd",
            node.etcd_urls or self.etcd_urls,
            "--ha-group",
            self.group,
            "--advertise-url",
            node.url,
            "--advertise-repl",
            f"127.0.0.1:{node.repl_port}",
            "--lease-ttl-s",
            str(self.ttl_s),
            "--sync-standbys",
            str(self.sync_standbys),
            "--batch-window-ms",
            "20",
            "--heartbeat-ms",
            "200",
            *self.extra,
        ]

    def start_node(self, node: Node) -> None:
        node.proc = self.procs.start_mercury(*self.argv(node), name=node.name)

    def kill(self, node: Node) -> None:
        """SIGKILL the candidate (its root process dies with it)."""
        assert node.proc is not None
        Procs.kill(node.proc)

    def stop(self, node: Node) -> None:
        """SIGTERM the candidate and wait for it."""
        assert node.proc is not None
        Procs.terminate(node.proc, timeout=30)

    def leader(self) -> Node | None:
        for node in self.nodes:
            st = node.status()
            if st is not None and st.get("role") == "leader":
                return node
        return None

    def wait_leader(self, timeout: float = DEADLINE_S, not_: Node | None = None) -> Node:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = self.leader()
            if node is not None and node is not not_:
                return node
            time.sleep(0.05)
        raise AssertionError(f"no leader after {timeout}s\n{self.procs.logs()}")

    def wait_standbys(self, count: int, timeout: float = DEADLINE_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            n = 0
            for node in self.nodes:
                st = node.status()
                if st is not None and st.get("standby_state") == "streaming":
                    n += 1
            if n >= count:
                return
            time.sleep(0.1)
        raise AssertionError(f"fewer than {count} standbys streaming\n{self.procs.logs()}")

    def wait_converged(self, timeout: float = DEADLINE_S) -> tuple[int, str]:
        """Wait until every running node reports the leader's seq and hash head."""
        deadline = time.monotonic() + timeout
        heads: list[tuple[Any, Any]] = []
        while time.monotonic() < deadline:
            heads = []
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is None:
                    st = node.status() or {}
                    heads.append((st.get("seq"), st.get("hash_head")))
            if heads and None not in heads[0] and len(set(heads)) == 1:
                return heads[0]
            time.sleep(0.1)
        raise AssertionError(f"nodes never converged: {heads}\n{self.procs.logs()}")


@dataclass
class Replica:
    """A plain replica listing every candidate's replication address as a source."""

    data_dir: Path
    http_port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def status(self) -> dict[str, Any] | None:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(self.url + "/v1/status", timeout=1.0)
            if r.status_code == 200:
                return r.json()  # type: ignore[no-any-return]
        return None


def start_replica(cluster: Cluster, data_dir: Path) -> Replica:
    """Start `mercury replica` with `--source` for every candidate (3 s staleness)."""
    rep = Replica(data_dir, free_port())
    sources = [a for n in cluster.nodes for a in ("--source", f"127.0.0.1:{n.repl_port}")]
    rep.proc = cluster.procs.start_mercury(
        "replica",
        str(data_dir),
        *sources,
        "--listen",
        f"127.0.0.1:{rep.http_port}",
        "--staleness-s",
        "3",
        "--failback-s",
        "0",
        name="replica",
    )
    return rep


class Writers:
    """`n` threads writing unique keys through any candidate (following 307s), recording
    every acknowledged write with the time it was acknowledged."""

    def __init__(self, cluster: Cluster, n: int = 8, pins: list[Node] | None = None) -> None:
        self.cluster = cluster
        self.n = n
        #: writer i writes only to pins[i % len(pins)] (no failover, no 307 following)
        self.pins = pins
        #: (monotonic time acknowledged, key, value, node that acknowledged)
        self.acked: list[tuple[float, str, bytes, str]] = []
        #: key -> monotonic time the acknowledged request was sent. The node acknowledged it
        #: between this and the time in `acked`; unlike that one, it cannot come out late
        #: when this thread is scheduled late, so a bound on when a node may still
        #: acknowledge is checked against it.
        self.sent: dict[str, float] = {}
        self.errors: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]

    def __enter__(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self, w: int) -> None:
        headers = {"Authorization": f"Bearer {self.cluster.token}"}
        nodes = self.cluster.nodes if self.pins is None else [self.pins[w % len(self.pins)]]
        i = 0
        target = 0
        # 307s are followed here, not by httpx: it drops the Authorization header on a
        # redirect to another origin (another candidate's port), as browsers do. The
        # pauses below are a client's before it retries, not waits for anything.
        with httpx.Client(timeout=5.0, headers=headers) as c:
            while not self._stop.is_set():
                key = f"k/w{w}/{i}"
                value = f"{w}:{i}:{time.time_ns()}".encode()
                while not self._stop.is_set():
                    sent_at = time.monotonic()
                    try:
                        r = c.put(f"{nodes[target].url}/v1/kv/{key}", content=value)
                    except httpx.HTTPError as err:
                        self._count(type(err).__name__)
                        target = (target + 1) % len(nodes)
                        time.sleep(0.02)
                        continue
                    if r.status_code == 200:
                        with self._lock:
                            self.acked.append((time.monotonic(), key, value, nodes[target].name))
                            self.sent[key] = sent_at
                        break
                    if r.status_code == 307:
                        loc = r.headers["location"]
                        target = next(
                            (j for j, n in enumerate(nodes) if loc.startswith(n.url + "/")), target
                        )
                        self._count("307")
                        if self.pins is not None:
                            time.sleep(0.05)
                        continue
                    self._count(str(r.status_code))
                    time.sleep(0.05)
                i += 1

    def _count(self, what: str) -> None:
        with self._lock:
            self.errors[what] = self.errors.get(what, 0) + 1

    def wait_acks(
        self,
        count: int,
        *,
        by: Node | None = None,
        after: float | None = None,
        timeout: float = DEADLINE_S,
    ) -> None:
        """Wait until `count` writes are acknowledged (by node `by`; after monotonic time
        `after`): writes in flight where a test would have paused "to let them write"."""

        def n() -> int:
            with self._lock:
                return sum(
                    1
                    for a in self.acked
                    if (by is None or a[3] == by.name) and (after is None or a[0] > after)
                )

        try:
            wait_until(lambda: n() >= count, timeout, f"{count} acknowledged writes")
        except TimeoutError as err:
            raise AssertionError(f"{err}: {n()} so far, errors {self.errors}") from None

    def first_ack_after(
        self, t0: float, timeout: float = DEADLINE_S, not_by: Node | None = None
    ) -> float:
        """Seconds from `t0` (monotonic) to the first write acknowledged after it (by a node
        other than `not_by`: an answer it sent before being killed may arrive after)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                after = [
                    a[0]
                    for a in self.acked
                    if a[0] > t0 and (not_by is None or a[3] != not_by.name)
                ]
            if after:
                return min(after) - t0
            time.sleep(0.02)
        raise AssertionError(f"no write acknowledged {timeout}s after the kill: {self.errors}")


def lost_writes(data_dir: Path, acked: list[tuple[float, str, bytes, str]]) -> list[str]:
    """Acknowledged writes a store does not hold (each key is written once)."""
    store = Store.open(str(data_dir), readonly=True)
    try:
        lost = []
        for _, k, v, _n in acked:
            got = store.get(k.encode())
            if got is None or got.value != v:
                lost.append(k)
        return lost
    finally:
        store.close()


def log_records(data_dir: Path) -> Iterator[tuple[int, int, bytes]]:
    """(first seq, entries, hash head) of every retained log record of a store."""
    store = Store.open(str(data_dir), readonly=True)
    try:
        first, _ = store.log_bounds()
        for r in records(store, max(first, 1)):
            yield r.first_seq, r.num_entries, r.hash_head
    finally:
        store.close()


def sigkill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
