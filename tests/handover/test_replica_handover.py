"""`kill -USR2` on a replica: the new executable takes the listening sockets over while a
steady reader (kept-alive connections and a new connection per read) runs; not one read
fails, the old process exits 0, the new one serves and applies (real processes)."""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

from reads.workers import READ_WORKER_ENV
from store.lock import holder_pid
from testkit import procstat
from testkit.procs import Procs, alive
from testkit.replication import status
from testkit.sockets import recv_until
from testkit.wait import wait_until
from tests.gateway.conftest import make_root
from tests.handover.readers import Readers
from tests.replicator.nodes import start_replica


def _stop_pid(pid: int) -> None:
    if alive(pid):
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not alive(pid), 30, f"pid {pid} stopped")


def test_a_replica_hands_over_without_failing_a_read(tmp_path: Path, procs: Procs) -> None:
    root = make_root(procs, tmp_path / "root")
    _, tok = root.producer(["p/"])
    w = root.client(tok)
    assert w.put("/v1/kv/p/k", content=b"v1").status_code in (200, 201)
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    rep = start_replica(procs, tmp_path / "rep", [repl_port], repl=False)
    seq = root.admin().get("/v1/status").json()["seq"]
    wait_until(lambda: status(rep.http)["seq"] >= seq, 60, "replica caught up")
    old = rep.proc.pid
    assert holder_pid(str(rep.data_dir)) == old
    log = next((tmp_path / "logs").glob("replica-*.log"))
    # A kept-alive connection idle when the old process starts draining: its next request
    # is still answered (then the connection closes), never reset.
    idle = socket.create_connection(("127.0.0.1", rep.http), timeout=10)
    get = b"GET /v1/kv/p/k HTTP/1.1\r\nHost: x\r\n\r\n"
    idle.sendall(get)
    assert recv_until(idle, b"v1").startswith(b"HTTP/1.1 200")
    new = 0
    with Readers(f"http://127.0.0.1:{rep.http}", "/v1/kv/p/k", b"v1", keepalive=2) as rd:
        wait_until(lambda: rd.tally.ok >= 50, 30, "reads before the hand-over")
        os.kill(old, signal.SIGUSR2)
        wait_until(lambda: "draining" in log.read_text(), 60, "old one draining")
        idle.sendall(get)
        last = recv_until(idle, b"v1")
        assert last.startswith(b"HTTP/1.1 200") and b"connection: close" in last.lower(), last
        assert idle.recv(1) == b""  # closed after that answer
        idle.close()
        assert rep.proc.wait(60) == 0, procs.logs()
        try:
            # The new process holds the writer lock once the old one let it go.
            new = wait_until(
                lambda: (
                    (holder_pid(str(rep.data_dir)) or old) != old and holder_pid(str(rep.data_dir))
                ),
                30,
                "new lock holder",
            )
            after = rd.tally.ok
            wait_until(lambda: rd.tally.ok >= after + 100, 30, "reads after the hand-over")
        finally:
            rd.stop.set()
    try:
        assert rd.tally.failed == [], (len(rd.tally.failed), rd.tally.failed[:5], procs.logs())
        assert alive(new)
        # The new process's worker applies: a write on the root reaches its store.
        assert w.put("/v1/kv/p/k2", content=b"v2").status_code in (200, 201)
        seq = root.admin().get("/v1/status").json()["seq"]
        wait_until(lambda: status(rep.http)["seq"] >= seq, 60, "new replica applies")
    finally:
        root.close_clients()
        if new:
            _stop_pid(new)


def test_a_new_replica_that_fails_leaves_the_old_one_serving(
    tmp_path: Path, procs: Procs, monkeypatch
) -> None:
    root = make_root(procs, tmp_path / "root")
    _, tok = root.producer(["p/"])
    assert root.client(tok).put("/v1/kv/p/k", content=b"v1").status_code in (200, 201)
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    # Only a process started by a hand-over reaches this failpoint (net/handover.py).
    monkeypatch.setenv("MERCURY_FAILPOINTS", "handover-before-ready=exit")
    rep = start_replica(procs, tmp_path / "rep", [repl_port], repl=False)
    log = next((tmp_path / "logs").glob("replica-*.log"))
    with Readers(f"http://127.0.0.1:{rep.http}", "/v1/kv/p/k", b"v1", keepalive=1, fresh=0) as rd:
        wait_until(lambda: rd.tally.ok >= 20, 30, "reads before")
        os.kill(rep.proc.pid, signal.SIGUSR2)
        wait_until(lambda: "handover-failed" in log.read_text(), 60, "hand-over abandoned")
        after = rd.tally.ok
        wait_until(lambda: rd.tally.ok >= after + 20, 30, "reads after")
    root.close_clients()
    assert rd.tally.failed == []
    assert rep.proc.poll() is None and holder_pid(str(rep.data_dir)) == rep.proc.pid
    assert "exited with 3" in log.read_text()


def _listening(port: int) -> set[int]:
    """Inodes of the sockets listening on 127.0.0.1:`port` (every process's)."""
    out = set()
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[1].split(":")[1], 16) == port:
                out.add(int(cols[9]))
    return out


def _readers(pid: int) -> list[int]:
    """Reader processes 1..n-1 of replica `pid` (its children that are not the worker)."""
    return [c for c in procstat.children(pid) if procstat.environ(c).get(READ_WORKER_ENV)]


def test_a_replica_with_reader_processes_hands_each_readers_sockets_over(
    tmp_path: Path, procs: Procs
) -> None:
    root = make_root(procs, tmp_path / "root")
    _, tok = root.producer(["p/"])
    assert root.client(tok).put("/v1/kv/p/k", content=b"v1").status_code in (200, 201)
    root.close_clients()
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    rep = start_replica(procs, tmp_path / "rep", [repl_port], "--read-workers", "2", repl=False)
    old = rep.proc.pid
    old_reader = wait_until(lambda: _readers(old), 60, "reader 1 started")[0]
    # reader 0's socket and reader 1's, both in the SO_REUSEPORT group
    sockets = wait_until(lambda: len(_listening(rep.http)) == 2 and _listening(rep.http), 60, "2")
    with Readers(f"http://127.0.0.1:{rep.http}", "/v1/kv/p/k", b"v1", keepalive=2, fresh=2) as rd:
        wait_until(lambda: rd.tally.ok >= 50, 30, "reads before the hand-over")
        os.kill(old, signal.SIGUSR2)
        assert rep.proc.wait(60) == 0, procs.logs()
        new = wait_until(
            lambda: (holder_pid(str(rep.data_dir)) or old) != old and holder_pid(str(rep.data_dir)),
            30,
            "new lock holder",
        )
        wait_until(lambda: _readers(new), 60, "new reader 1")
        after = rd.tally.ok
        wait_until(lambda: rd.tally.ok >= after + 100, 30, "reads after the hand-over")
    assert rd.tally.failed == [], (len(rd.tally.failed), rd.tally.failed[:5])
    wait_until(lambda: not alive(old_reader), 30, "old reader 1 gone")
    # The new readers listen on the old readers' very sockets: none was bound afresh, none
    # closed (so no connection waiting in a queue was dropped).
    assert _listening(rep.http) == sockets
