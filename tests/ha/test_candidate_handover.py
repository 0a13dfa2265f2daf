"""`kill -USR2` on an HA standby candidate (real etcd, three real candidates): the new
executable takes the front's listening socket, reads the election key, reports READY; the
old one revokes its lease, closes its store, finishes the writes it was forwarding and
exits 0; the new one opens the store and streams from the leader again. SDK writers given
every candidate's URL (the standby's first: their writes pass through its front) see not
one failure, and every acknowledged write is on every node.

`kill -USR2` on the leader: it steps down (its root answers its open batch, the election
key is deleted: a standby wins), then hands over as a standby; the SDK writers see not one
failure, no acknowledged write is lost, the old PID exits 0 and the new one streams.
"""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import httpx

from mercury_client import Client, MercuryClientError
from store.lock import holder_pid
from testkit.etcd import Etcd
from testkit.hacluster import Cluster, Node
from testkit.procs import Procs, alive
from testkit.wait import wait_until

WRITERS = 4


class _Writers:
    """SDK writers on `urls` until stopped; every acknowledged key recorded."""

    def __init__(self, urls: list[str], token: str) -> None:
        self.urls = urls
        self.token = token
        self.acked: list[tuple[str, str]] = []
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(w,)) for w in range(WRITERS)]

    def __enter__(self) -> _Writers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(60)
        assert not any(t.is_alive() for t in self._threads)

    def _run(self, w: int) -> None:
        # Default settings, bounded: at most 5000 writes per writer.
        with Client(self.urls, self.token) as c:
            for i in range(5000):
                if self.stop.is_set():
                    return
                key, value = f"k/w{w}-{i}", f"v{i}"
                try:
                    c.put(key, value)
                except MercuryClientError as err:
                    self.failures.append(err)
                    return
                self.acked.append((key, value))


class _Prober:
    """A new connection per `GET /v1/status` to one address until stopped: the port is
    never closed, so not one connection is refused or reset."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.ok = 0
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> _Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        for _ in range(100_000):  # bounded; stopped long before
            if self.stop.is_set():
                return
            try:
                r = httpx.get(self.url + "/v1/status", timeout=10)
            except httpx.HTTPError as err:
                self.errors.append(repr(err))
                continue
            if r.status_code == 200:
                self.ok += 1
            else:
                self.errors.append(f"{r.status_code} {r.text[:200]}")


def _new_pid(log: Path) -> int:
    found = re.findall(r'"event":"handover-start".*?"new_pid":(\d+)', log.read_text())
    return int(found[-1]) if found else 0


def _stop_pid(pid: int) -> None:
    if pid and alive(pid):
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not alive(pid), 30, f"pid {pid} stopped")


def test_a_standby_hands_over_under_sdk_writers(etcd: Etcd, procs: Procs, tmp_path: Path) -> None:
    cluster = Cluster(procs, tmp_path, etcd.url, n=3, extra=("--ha-forward",))
    cluster.start()
    leader = cluster.wait_leader()
    standby = next(n for n in cluster.nodes if n is not leader)
    assert standby.proc is not None
    old = standby.proc.pid
    log = next((tmp_path / "logs").glob(f"{standby.name}-*.log"))
    urls = [standby.url] + [n.url for n in cluster.nodes if n is not standby]
    new = 0
    try:
        with _Writers(urls, cluster.token) as wr, _Prober(standby.url) as probe:
            wait_until(lambda: len(wr.acked) >= 40, 60, "writes before the hand-over")
            os.kill(old, signal.SIGUSR2)
            wait_until(lambda: _new_pid(log) > 0, 30, "the new process started")
            new = _new_pid(log)
            assert standby.proc.wait(60) == 0, procs.logs()
            # The new process follows the leader again, holding the store.
            _wait_streaming(standby, new, log)
            after = len(wr.acked)
            wait_until(lambda: len(wr.acked) >= after + 40, 60, "writes after the hand-over")
        assert wr.failures == [], wr.failures
        assert probe.errors == [] and probe.ok > 0, probe.errors[:5]
        assert alive(new)
        cluster.wait_converged()
        with Client([leader.url], cluster.token) as c:
            for key, value in wr.acked:
                assert c.get(key) == value.encode(), key
    finally:
        _stop_pid(new)


def _wait_streaming(node: Node, new: int, log: Path) -> None:
    """Wait until the new process `new` holds `node`'s store and streams from the leader;
    on a timeout, say what it was doing instead (its status and its log's tail)."""
    seen: list[object] = []

    def streaming() -> bool:
        st = node.status()
        seen[:] = [st, holder_pid(str(node.data_dir))]
        return st is not None and st.get("standby_state") == "streaming" and seen[1] == new

    try:
        wait_until(streaming, 60, "the new process streaming")
    except TimeoutError as err:
        raise AssertionError(
            f"{err}: pid {new}, last status and store holder {seen}\n{log.read_text()[-6000:]}"
        ) from err


def test_a_leader_steps_down_then_hands_over_under_sdk_writers(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    cluster = Cluster(procs, tmp_path, etcd.url, n=3, extra=("--ha-forward",))
    cluster.start()
    leader = cluster.wait_leader()
    assert leader.proc is not None
    old = leader.proc.pid
    log = next((tmp_path / "logs").glob(f"{leader.name}-*.log"))
    urls = [leader.url] + [n.url for n in cluster.nodes if n is not leader]
    new = 0
    try:
        with _Writers(urls, cluster.token) as wr:
            wait_until(lambda: len(wr.acked) >= 40, 60, "writes before the hand-over")
            os.kill(old, signal.SIGUSR2)
            # It hands the lead to a standby, then over to the new process as a standby.
            successor = cluster.wait_leader(not_=leader)
            wait_until(lambda: _new_pid(log) > 0, 60, "the new process started")
            new = _new_pid(log)
            assert leader.proc.wait(60) == 0, procs.logs()
            _wait_streaming(leader, new, log)
            after = len(wr.acked)
            wait_until(lambda: len(wr.acked) >= after + 40, 60, "writes after the hand-over")
        assert wr.failures == [], wr.failures
        assert alive(new)
        cluster.wait_converged()
        with Client([successor.url], cluster.token) as c:
            for key, value in wr.acked:
                assert c.get(key) == value.encode(), key
    finally:
        _stop_pid(new)
