"""Hostile peers on the replication port: forged frame lengths, a bootstrap client that never
reads. Real processes and sockets; the in-process source (`RootNode`) where the test must
shorten a timeout."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from pathlib import Path

import httpx
import pytest

from replicator import frames
from store.ops import SET, Op
from tests.replicator.harness import root_node, status, wait_for
from tests.replicator.nodes import start_replica
from tests.support.procs import Procs, free_port, run_mercury, wait_http


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True when the peer closes `sock` (EOF or reset) within `seconds`."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


def _start_root(procs: Procs, data: Path) -> tuple[int, int, int]:
    assert run_mercury("init", str(data)).returncode == 0
    gw, repl = free_port(), free_port()
    root = procs.start_mercury(
        "root", str(data), "--listen", f"127.0.0.1:{gw}", "--repl-listen", f"127.0.0.1:{repl}",
        name="root",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)
    return root.pid, gw, repl


def test_oversized_hello_is_closed_at_its_header_without_growing_memory(
    tmp_path: Path, procs: Procs
) -> None:
    pid, gw, repl = _start_root(procs, tmp_path / "root")
    before = _rss_kib(pid)
    claim = 200 << 20
    header = frames.HEADER.pack(frames.HELLO, 0, claim, 0)
    socks = [socket.create_connection(("127.0.0.1", repl), 5) for _ in range(4)]
    try:
        for s in socks:
            s.sendall(header)
        # Keep pushing body bytes: a source that believes the header buffers them all.
        chunk = b"\x00" * (1 << 20)
        for s in socks:
            s.settimeout(5)
            try:
                for _ in range(16):
                    s.sendall(chunk)
            except OSError:
                pass  # closed by the source: what we want
        closed = [_closed_within(s, 3.0) for s in socks]
        assert all(closed), f"connections left open after a 200 MiB HELLO claim: {closed}"
        grown = _rss_kib(pid) - before
        assert grown < 8 << 10, f"root RSS grew by {grown} KiB"
    finally:
        for s in socks:
            s.close()
    # The root keeps serving: its HTTP face and its replication port.
    assert httpx.get(f"http://127.0.0.1:{gw}/healthz", timeout=5).status_code == 200
    with socket.create_connection(("127.0.0.1", repl), 5) as s:
        s.sendall(frames.encode_frame(frames.WAIT, b"\x00" * 4))  # not a HELLO: closed
        assert _closed_within(s, 3.0)


def test_replication_listener_refuses_connections_over_its_cap(tmp_path: Path) -> None:
    with root_node(str(tmp_path / "root"), max_connections=3) as root:
        held = [socket.create_connection(("127.0.0.1", root.port), 5) for _ in range(3)]
        try:
            wait_for(lambda: len(root.source._conns) == 3, 10, "3 connections accepted")
            with socket.create_connection(("127.0.0.1", root.port), 5) as extra:
                assert _closed_within(extra, 3.0)
            assert root.source.refused_connections == 1
        finally:
            for s in held:
                s.close()


def test_bootstrap_client_that_never_reads_loses_its_slot(
    tmp_path: Path, procs: Procs, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mercury.replication.source")
    with root_node(str(tmp_path / "root"), max_bootstraps=1, stall_timeout=6.0) as root:
        # Bigger than every socket buffer between the source and a client that never reads.
        value = os.urandom(16 << 10)
        for b in range(0, 1200, 200):
            root.store.apply([Op(SET, b"k%06d" % i, value, "t") for i in range(b, b + 200)])
        hostile = socket.socket()
        hostile.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hostile.connect(("127.0.0.1", root.port))
        try:
            hello = frames.Hello(
                frames.PROTOCOL_VERSION, frames.MODE_SNAPSHOT, 0, uuid.uuid4().bytes,
                frames.ZERO_ID, 0, 0, 0, frames.ZERO_SHA,
            )  # fmt: skip
            hostile.sendall(frames.encode_hello(hello))
            wait_for(lambda: root.source.stats.active == 1, 20, "the hostile client's slot")
            t0 = time.monotonic()
            r = start_replica(procs, tmp_path / "r1", [root.port], repl=False, name="r1")
            seq = root.store.last_seq()
            wait_for(lambda: status(r.http)["seq"] >= seq, 60, "the replica's bootstrap")
            took = time.monotonic() - t0
        finally:
            hostile.close()
    assert root.source.stats.stalled == 1
    assert root.source.stats.served == 1
    text = caplog.text
    assert "stalled: no progress for 6s" in text, text
    assert "waits for a bootstrap slot; held by" in text, text
    assert took < 60  # generous: bounded by the stall timeout, not by the hostile client
