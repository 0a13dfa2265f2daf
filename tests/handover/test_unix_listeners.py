"""Unix socket listeners on a replica (`--listen unix:/path`, `--memcached-listen
unix:/path`, `--unix-mode`): they serve reads, carry the mode asked for, and a hand-over
keeps the very same sockets (real processes)."""

from __future__ import annotations

import os
import signal
import socket
import stat
from pathlib import Path

import httpx

from store.lock import holder_pid
from testkit.procs import Procs, alive
from testkit.replication import wait_for
from testkit.sockets import recv_until
from testkit.wait import wait_until
from tests.gateway.conftest import make_root
from tests.replicator.nodes import start_replica


def _get(path: Path, key: str) -> httpx.Response:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), timeout=10) as c:
        return c.get(f"http://replica/v1/kv/{key}")


def _mc_get(path: Path, key: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(path))
        s.sendall(f"get {key}\r\n".encode())
        return recv_until(s, b"END\r\n")


def test_unix_listeners_serve_with_their_mode_and_survive_a_hand_over(
    tmp_path: Path, procs: Procs
) -> None:
    root = make_root(procs, tmp_path / "root")
    _, tok = root.producer(["p/"])
    assert root.client(tok).put("/v1/kv/p/k", content=b"v1").status_code in (200, 201)
    root.close_clients()
    repl_port = int(root.args[root.args.index("--repl-listen") + 1].rsplit(":", 1)[1])
    socks = tmp_path / "s"
    socks.mkdir()
    http, mc = socks / "read.sock", socks / "mc.sock"
    rep = start_replica(
        procs,
        tmp_path / "rep",
        [repl_port],
        "--listen",
        f"unix:{http}",
        "--memcached-listen",
        f"unix:{mc}",
        "--unix-mode",
        "600",
        "--drain-s",
        "60",
        "--allow-unauthenticated-reads",
        repl=False,
        wait=False,
    )
    wait_for(lambda: http.exists() and _get(http, "p/k").status_code == 200, 60, "unix reads")
    assert _get(http, "p/k").content == b"v1"
    assert _mc_get(mc, "p/k") == b"VALUE p/k 0 2\r\nv1\r\nEND\r\n"
    for p in (http, mc):
        assert stat.S_ISSOCK(os.stat(p).st_mode) and stat.S_IMODE(os.stat(p).st_mode) == 0o600
    inodes = {p: os.stat(p).st_ino for p in (http, mc)}

    old = rep.proc.pid
    log = next((tmp_path / "logs").glob("replica-*.log"))
    # A memcached request half sent when the hand-over starts is answered by the old
    # process (it drains), and only then is its connection closed.
    half = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    half.connect(str(mc))
    half.sendall(b"get p/")
    # An idle memcached connection is closed as the drain starts, not at the end of the
    # drain (which an idle kept-alive HTTP connection holds open up to --drain-s 60).
    idle_mc = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle_mc.connect(str(mc))
    idle_mc.sendall(b"get p/k\r\n")
    assert recv_until(idle_mc, b"END\r\n").startswith(b"VALUE")
    idle_http = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    idle_http.connect(str(http))
    idle_http.sendall(b"GET /v1/kv/p/k HTTP/1.1\r\nHost: x\r\n\r\n")
    assert recv_until(idle_http, b"v1").startswith(b"HTTP/1.1 200")
    os.kill(old, signal.SIGUSR2)
    wait_until(lambda: "draining" in log.read_text(), 60, "old one draining")
    idle_mc.settimeout(30)
    assert idle_mc.recv(1) == b""
    idle_mc.close()
    half.sendall(b"k\r\n")
    assert recv_until(half, b"END\r\n") == b"VALUE p/k 0 2\r\nv1\r\nEND\r\n"
    assert half.recv(1) == b""  # then closed: nothing of it in progress
    half.close()
    idle_http.close()
    assert rep.proc.wait(60) == 0, procs.logs()
    new = wait_until(
        lambda: holder_pid(str(rep.data_dir)) != old and holder_pid(str(rep.data_dir)),
        30,
        "new lock holder",
    )
    try:
        # The same socket files (never unlinked nor bound again), served by the new one.
        assert {p: os.stat(p).st_ino for p in (http, mc)} == inodes
        assert _get(http, "p/k").content == b"v1"
        assert _mc_get(mc, "p/k") == b"VALUE p/k 0 2\r\nv1\r\nEND\r\n"
    finally:
        if alive(new):
            os.kill(new, signal.SIGTERM)
            wait_until(lambda: not alive(new), 30, "new replica stopped")


def test_a_unix_listener_is_refused_with_several_read_workers(tmp_path: Path) -> None:
    from testkit.procs import run_mercury

    out = run_mercury(
        "replica",
        str(tmp_path / "r"),
        "--source",
        "127.0.0.1:1",
        "--listen",
        f"unix:{tmp_path}/r.sock",
        "--read-workers",
        "2",
    )
    assert out.returncode == 2 and "one reader process" in out.stderr, out.stderr
    bad = run_mercury(
        "replica", str(tmp_path / "r"), "--source", "127.0.0.1:1", "--listen", "unix:relative.sock"
    )
    assert bad.returncode == 2 and "--listen" in bad.stderr, bad.stderr
