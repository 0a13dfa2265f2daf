"""`--read-workers N`: N reader processes on one store share the listeners (SO_REUSEPORT),
a killed reader is restarted while the others keep serving, `/metrics` from any reader
covers all of them (`worker` label), and stopping the node stops every reader (real
processes, sockets and LMDB)."""

from __future__ import annotations

import os
import re
import signal
import socket
import sys
from pathlib import Path

import httpx

from reads.workers import migrate_req
from store.ops import SET, Op
from store.store import Store
from testkit import procstat
from testkit.procs import Procs, alive, free_port, wait_http, wait_port
from testkit.replication import wait_for
from testkit.wait import wait_until
from tests.gateway.conftest import make_root
from tests.replicator.nodes import start_replica


def _readers(pid: int) -> list[int]:
    """Reader processes started by `pid` (their environment names their index)."""
    out = []
    for c in procstat.children(pid):
        try:
            env = procstat.environ(c)
        except OSError:
            continue  # gone since it was listed
        if "MERCURY_READ_WORKER" in env:
            out.append(c)
    return out


def _mc_get(port: int, key: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"get " + key + b"\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            chunk = s.recv(4096)
            assert chunk, "closed"
            buf += chunk
        return buf


def _per_worker(url: str, op: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    pat = rf'mercury_read_seconds_count\{{op="{op}",worker="(\d+)"\}} ([0-9.e+]+)'
    return {w: float(v) for w, v in re.findall(pat, text)}


def _spread_gets(url: str, mc: int, n: int) -> None:
    """`n` GETs and memcached gets, each on a new connection (so the kernel spreads them)."""
    for _ in range(n):
        r = httpx.get(url + "/v1/kv/k", timeout=10, headers={"Connection": "close"})
        assert r.status_code == 200 and r.content == b"v"
        assert _mc_get(mc, b"k") == b"VALUE k 0 1\r\nv\r\nEND\r\n"


def test_two_readers_serve_and_a_killed_one_is_restarted(tmp_path: Path, procs: Procs) -> None:
    d = str(tmp_path / "s")
    with Store.create(d) as s:
        s.apply([Op(SET, b"k", b"v", "p")])
    http, mc = free_port(), free_port()
    argv = [sys.executable, "-m", "mercury.readserve", d, "--listen", f"127.0.0.1:{http}"]
    argv += ["--memcached-listen", f"127.0.0.1:{mc}", "--read-workers", "2"]
    p = procs.start(argv, name="reads")
    url = f"http://127.0.0.1:{http}"
    wait_http(url + "/healthz", proc=p)
    wait_port(mc, proc=p)
    wait_for(lambda: len(_readers(p.pid)) == 1, 30, "reader 1 started")
    (first,) = _readers(p.pid)

    # Both readers answer (over new connections the kernel hashes across both sockets).
    def both_served() -> bool:
        _spread_gets(url, mc, 10)
        counts = _per_worker(url, "http_get")
        return all(counts.get(w, 0) > 0 for w in ("0", "1"))

    wait_for(both_served, 60, "both readers served GETs")
    assert set(_per_worker(url, "memcached_get")) == {"0", "1"}

    # Reader 1 killed: once it is gone every request is answered (by reader 0) until it
    # comes back. Not the requests racing the kill itself: a connection the dying reader
    # has accepted, or holds in its own accept queue, dies with it (docs/reads.md).
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), 10, "reader 1 gone")

    def restarted() -> bool:
        _spread_gets(url, mc, 1)  # every request answered while reader 1 is away
        return any(r != first for r in _readers(p.pid))

    # Requests all along the absence (at least the 0.5 s restart backoff), not for a fixed
    # time that may end before or after it; a failed GET fails the test, never retried.
    wait_until(restarted, 30, "reader 1 restarted")
    _spread_gets(url, mc, 5)

    # Stopping reader 0 by its PID stops every reader.
    readers = _readers(p.pid)
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    wait_for(lambda: not any(alive(r) for r in readers), 15, "readers stopped")
    assert not os.listdir(os.path.join(d, "readers"))  # no reader left its metrics file


def test_replica_with_two_readers(tmp_path: Path, procs: Procs) -> None:
    root = make_root(procs, tmp_path / "root")
    _, token = root.producer(["k"])
    r = root.client(token).put("/v1/kv/k", content=b"v")
    root.close_clients()
    assert r.status_code in (200, 201), r.text
    mc = free_port()
    replica = start_replica(
        procs,
        tmp_path / "r",
        [int(root.args[3].split(":")[1])],
        "--read-workers",
        "2",
        "--memcached-listen",
        f"127.0.0.1:{mc}",
        name="r",
    )
    url = f"http://127.0.0.1:{replica.http}"
    wait_for(lambda: httpx.get(url + "/v1/kv/k", timeout=5).status_code == 200, 60, "synced")
    pid = replica.proc.pid
    wait_for(lambda: len(_readers(pid)) == 1, 60, "reader 1 started")
    readers = _readers(pid)

    def both_served() -> bool:
        _spread_gets(url, mc, 10)
        counts = _per_worker(url, "http_get")
        return all(counts.get(w, 0) > 0 for w in ("0", "1"))

    wait_for(both_served, 60, "both readers served GETs")
    # The node's own facts are the same from either reader.
    st = [httpx.get(url + "/v1/status", timeout=5, headers={"Connection": "close"}).json()]
    st += [httpx.get(url + "/v1/status", timeout=5, headers={"Connection": "close"}).json()]
    assert all("lag_seconds" in s and s["role"] == "replica" for s in st)

    replica.proc.send_signal(signal.SIGTERM)
    replica.proc.wait(30)
    wait_for(lambda: not any(alive(x) for x in readers), 15, "readers stopped")


def test_whether_the_kernel_migrates_a_dead_readers_connections_is_read_as_set(
    tmp_path: Path,
) -> None:
    f = tmp_path / "tcp_migrate_req"
    f.write_text("0\n")
    assert migrate_req(str(f)) is False
    f.write_text("1\n")
    assert migrate_req(str(f)) is True
    assert migrate_req(str(tmp_path / "absent")) is None
