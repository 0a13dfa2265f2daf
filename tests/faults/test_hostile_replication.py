"""Hostile peers on the replication port: forged frame lengths, a bootstrap client that never
reads. Real processes and sockets; the in-process source (`RootNode`) where the test must
shorten a timeout."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import BinaryIO

import httpx
import pytest
import snappy

from replicator import frames
from store import chainhash
from store import format as fmt
from store.ops import SET, Op
from testkit import metrics, procstat
from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.replication import root_node, status, wait_for, wait_seq
from testkit.trickle import Trickler
from tests.replicator.nodes import start_replica


def _rss_kib(pid: int) -> int:
    return procstat.rss_bytes(pid) // 1024


def _retry_window() -> None:
    """A deliberate pause, for what must not happen (another connection, another error):
    only giving it time shows it does not. Reconnects back off from 0.1 s, doubling, so a
    node that still retried would do so several times in 2 s. A correct node passes however
    long the pause really lasts; only how surely a regression is caught depends on it."""
    time.sleep(2.0)


def _frame_type(f: BinaryIO) -> int:
    """Read one whole frame from `f`; its type."""
    ftype, _flags, length, _crc = frames.HEADER.unpack(f.read(frames.HEADER_SIZE))
    f.read(length)
    return int(ftype)


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


def _hello(db_id: bytes) -> bytes:
    """A stream HELLO from a new replica (seq 0) of the store `db_id`."""
    return frames.encode_hello(
        frames.Hello(1, 1, 0x01, os.urandom(16), db_id, 0, 0, 0, frames.ZERO_SHA)
    )


def _welcomed(sock: socket.socket) -> bool:
    """True when the source answers `sock`'s HELLO with a WELCOME."""
    sock.settimeout(10)
    with sock.makefile("rb") as f:
        return _frame_type(f) == frames.WELCOME


def test_replication_listener_refuses_connections_over_its_cap_when_every_slot_streams(
    tmp_path: Path,
) -> None:
    with root_node(str(tmp_path / "root"), max_connections=3) as root:
        db_id = uuid.UUID(root.store.db_id).bytes
        held = [socket.create_connection(("127.0.0.1", root.port), 5) for _ in range(3)]
        try:
            for s in held:
                s.sendall(_hello(db_id))
                assert _welcomed(s)
            with socket.create_connection(("127.0.0.1", root.port), 5) as extra:
                assert _closed_within(extra, 3.0)
            assert root.source.refused_connections == 1
            for s in held:  # no stream was closed for it
                assert not _closed_within(s, 0.2)
        finally:
            for s in held:
                s.close()


def test_connections_that_send_no_hello_cannot_lock_a_replica_out_at_the_cap(
    tmp_path: Path, procs: Procs
) -> None:
    """Red team: sockets that connect to the replication port and send nothing (closed
    after the HELLO timeout, reopened at once) held every slot of the cap, and every
    replica that came was refused ("too_many"), for as long as the attack went on. At the
    cap a newcomer now takes the slot of the one waiting longest for its HELLO; a stream
    (past its HELLO) is never the one to go."""
    _pid, gw, repl = _start_root(procs, tmp_path / "root")
    db_id = uuid.UUID(httpx.get(f"http://127.0.0.1:{gw}/v1/status").json()["db_id"]).bytes
    root_log = next(procs.log_dir.glob("root-*.log"))
    cap = 256  # the source's default (replicator.source.MAX_CONNECTIONS)
    streaming = socket.create_connection(("127.0.0.1", repl), 5)
    attack = Trickler(repl, b"", conns=cap + 5, every_s=30.0, max_s=120.0)
    try:
        streaming.sendall(_hello(db_id))
        assert _welcomed(streaming)
        attack.start()
        wait_for(lambda: attack.opened >= cap + 5, 30, "the attack holds the cap")
        # A replica's HELLO at the full cap is welcomed, a real replica catches up.
        with socket.create_connection(("127.0.0.1", repl), 5) as newcomer:
            newcomer.sendall(_hello(db_id))
            assert _welcomed(newcomer)
        replica = start_replica(procs, tmp_path / "replica", [repl], repl=False)
        wait_seq(replica.http, 1, timeout=60)
        # The stream admitted before the attack was never evicted.
        assert not _closed_within(streaming, 0.2)
        text = httpx.get(f"http://127.0.0.1:{gw}/metrics", timeout=5).text
        assert metrics.value(text, "mercury_repl_refused_total", reason="evicted") >= 5
    finally:
        attack.stop()
        streaming.close()
    assert "Traceback" not in root_log.read_text()


def test_a_stream_client_that_hangs_up_is_a_disconnect_not_an_error(
    tmp_path: Path, procs: Procs
) -> None:
    """On uvloop a write to a transport the peer closed raises RuntimeError, not a
    ConnectionError: each routine hang-up of a caught-up stream logged an ERROR traceback
    ("Unhandled exception in client_connected_cb")."""
    _pid, gw, repl = _start_root(procs, tmp_path / "root")
    db_id = uuid.UUID(httpx.get(f"http://127.0.0.1:{gw}/v1/status").json()["db_id"]).bytes
    root_log = next(procs.log_dir.glob("root-*.log"))
    for i in range(3):
        with socket.create_connection(("127.0.0.1", repl), 5) as s:
            hello = frames.Hello(1, 1, 0x01, os.urandom(16), db_id, 0, 0, 0, frames.ZERO_SHA)
            s.sendall(frames.encode_hello(hello))
            s.settimeout(10)
            with s.makefile("rb") as f:
                assert _frame_type(f) == frames.WELCOME
                # Its first heartbeat: the stream is caught up and waits for the next one.
                while _frame_type(f) != frames.HEARTBEAT:
                    pass
            # A reset: the source's transport closes on its read side, before its writer
            # next writes (the hang-up of a replica killed mid-stream).
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        # The source's next heartbeat meets the closed transport: a hang-up, logged as one.
        def logged(n: int = i + 1) -> bool:
            return root_log.read_text(errors="replace").count("disconnected") >= n

        wait_for(logged, 30, f"hang-up {i + 1} logged")
    logs = procs.logs()
    assert "client_connected_cb" not in logs and "Traceback" not in logs, logs[-3000:]


def test_a_connection_without_a_whole_hello_is_closed_after_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    with root_node(str(tmp_path / "root"), hello_timeout=1.0) as root:
        silent = socket.create_connection(("127.0.0.1", root.port), 5)
        partial = socket.create_connection(("127.0.0.1", root.port), 5)
        with silent, partial:
            partial.sendall(frames.encode_hello(frames.Hello(
                1, 1, 0, b"\x01" * 16, b"\x02" * 16, 0, 0, 0, frames.ZERO_SHA
            ))[:50])  # fmt: skip
            assert _closed_within(silent, 5.0)
            assert _closed_within(partial, 5.0)
        wait_for(lambda: not root.source._conns, 5, "connections released")


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


def _metric(http: int, name: str) -> float | None:
    text = httpx.get(f"http://127.0.0.1:{http}/metrics", timeout=5).text
    return metrics.unlabelled(text).get(name)


@pytest.mark.parametrize("batch", [10, 7], ids=["continues-at-next-seq", "repeats-a-seq"])
def test_replica_of_a_root_restored_from_an_older_copy_stops_as_diverged(
    tmp_path: Path, procs: Procs, batch: int
) -> None:
    live, old = tmp_path / "root", tmp_path / "root-old"
    with root_node(str(live)) as root:
        root.write(50, batch=10)
        port = root.port
    shutil.copytree(live, old)  # the "backup" the root is later restored from
    with root_node(str(live), port=port, reopen=True) as root:
        root.write(50, start=50, batch=10)
        r = start_replica(procs, tmp_path / "r1", [port], repl=False, name="r1")
        wait_for(lambda: status(r.http)["seq"] >= 100, 60, "replica at seq 100")
    replica_head = status(r.http)["hash_head"]
    # The root comes back from the older copy and takes other writes past seq 100.
    with root_node(str(old), port=port, reopen=True) as root:
        root.write(84, start=50, batch=batch, prefix="other")
        wait_for(lambda: status(r.http)["replication_state"] == "diverged", 60, "state diverged")
        st = status(r.http)
        err = st["replication_error"]
        assert "diverged history" in err and "rm -r DATA_DIR" in err, err
        if batch == 10:  # the record at 101 does not chain from the replica's head
            assert replica_head in err, err
        assert _metric(r.http, "mercury_replication_diverged") == 1.0
        # Terminal: no more retries, and reads keep being served.
        errors = st["replication_errors"]
        _retry_window()
        st2 = status(r.http)
        assert st2["replication_state"] == "diverged"
        assert st2["replication_errors"] == errors
        assert st2["seq"] == 100
        got = httpx.get(f"http://127.0.0.1:{r.http}/v1/kv/k00000099", timeout=5)
        assert got.status_code == 200


def test_replica_ahead_of_a_restored_root_is_diverged_before_the_root_catches_up(
    tmp_path: Path, procs: Procs
) -> None:
    live, old = tmp_path / "root", tmp_path / "root-old"
    with root_node(str(live)) as root:
        root.write(50, batch=10)
        port = root.port
    shutil.copytree(live, old)
    # Seqs 51..100 were committed two minutes before the restore.
    then = time.time_ns() // 1000 - 120_000_000
    with root_node(str(live), port=port, reopen=True) as root:
        for b in range(50, 100, 10):
            root.store.apply(
                [Op(SET, b"k%08d" % i, b"late", "t") for i in range(b, b + 10)], time_us=then
            )
        r = start_replica(procs, tmp_path / "r1", [port], repl=False, name="r1")
        wait_for(lambda: status(r.http)["seq"] >= 100, 60, "replica at seq 100")
    replica_head = status(r.http)["hash_head"]
    # Restored at seq 50, no write since: its heartbeats say so.
    with root_node(str(old), port=port, reopen=True):
        wait_for(lambda: status(r.http)["replication_state"] == "diverged", 30, "diverged")
        err = status(r.http)["replication_error"]
        assert "the root lost history" in err and replica_head in err, err
        assert "rm -r DATA_DIR" in err, err
        assert _metric(r.http, "mercury_replication_diverged") == 1.0
        assert status(r.http)["seq"] == 100


def _wait_state(http: int, state: str, timeout: float) -> None:
    wait_for(lambda: status(http)["replication_state"] == state, timeout, f"state {state}")


def test_chain_below_a_root_restored_to_the_same_seq_stops_as_diverged_without_a_write(
    tmp_path: Path, procs: Procs
) -> None:
    """root -> A -> B at seq 70; the root comes back from a copy at seq 30 and takes one
    batch of 40 other keys: it is at seq 70 again with another history. No record ever
    reaches A, so only the heads in the heartbeats can tell; A stops as diverged and
    refuses B as such, and B (same seq, same head as A) stops as diverged too. No further
    write to the root."""
    live, old = tmp_path / "root", tmp_path / "root-old"
    with root_node(str(live)) as root:
        root.write(30, batch=10)
        port = root.port
    shutil.copytree(live, old)  # the "backup" the root is later restored from
    with root_node(str(live), port=port, reopen=True) as root:
        root.write(40, start=30, batch=10)
        a = start_replica(procs, tmp_path / "a", [port], name="A")
        b = start_replica(procs, tmp_path / "b", [a.repl], repl=False, name="B")
        for r in (a, b):
            wait_seq(r.http, 70)
    head = status(a.http)["hash_head"]
    assert status(b.http)["hash_head"] == head
    with root_node(str(old), port=port, reopen=True) as root:
        root.write(40, start=30, batch=40, prefix="other")
        assert root.store.head()[0] == 70 and root.store.head()[1].hex() != head
        for r in (a, b):
            _wait_state(r.http, "diverged", 60)
        for r in (a, b):
            st = status(r.http)
            err = st["replication_error"]
            assert "diverged history at seq 70" in err and head in err, err
            assert "rm -r DATA_DIR" in err, err
            assert _metric(r.http, "mercury_replication_diverged") == 1.0
            assert st["seq"] == 70
        assert root.store.head()[0] == 70  # nothing was written to get there
        # Terminal on both, no flapping: B stays diverged and stops reconnecting to A.
        errors = status(b.http)["replication_errors"]
        _retry_window()
        for r in (a, b):
            assert status(r.http)["replication_state"] == "diverged"
        assert status(b.http)["replication_errors"] == errors
        got = httpx.get(f"http://127.0.0.1:{b.http}/v1/kv/k00000069", timeout=5)
        assert got.status_code == 200  # reads keep being served


def test_replica_ahead_of_a_restored_root_with_other_writes_is_diverged_at_once(
    tmp_path: Path, procs: Procs
) -> None:
    """The replica is at seq 70 (committed just now: the 60 s rollback margin has not
    passed); the root comes back at seq 30 and takes 20 other keys, so it reports seq 50
    with another head than the replica's at 50. No write brings it to 70 again."""
    live, old = tmp_path / "root", tmp_path / "root-old"
    with root_node(str(live)) as root:
        root.write(30, batch=10)
        port = root.port
    shutil.copytree(live, old)
    with root_node(str(live), port=port, reopen=True) as root:
        root.write(40, start=30, batch=10)
        r = start_replica(procs, tmp_path / "r1", [port], repl=False, name="r1")
        wait_for(lambda: status(r.http)["seq"] >= 70, 60, "replica at seq 70")
    replica_head = status(r.http)["hash_head"]
    with root_node(str(old), port=port, reopen=True) as root:
        root.write(20, start=30, batch=20, prefix="other")
        wait_for(lambda: status(r.http)["replication_state"] == "diverged", 30, "diverged")
        err = status(r.http)["replication_error"]
        assert "diverged history at seq 50" in err and replica_head in err, err
        assert "rm -r DATA_DIR" in err, err
        assert _metric(r.http, "mercury_replication_diverged") == 1.0
        assert status(r.http)["seq"] == 70


class _ForgingSource:
    """A replication source on a real socket that answers any HELLO with a WELCOME and
    one well-formed RECORD (CRC and hash chain `alg` hold) whose key is `key`."""

    def __init__(
        self, port: int, last_seq: int, head: bytes, db_id: bytes, key: bytes, alg: int
    ) -> None:
        ops = [(fmt.OP_SET, b"t", key, b"v")]
        payload, new_head = fmt.pack_entries(last_seq + 1, ops, head, alg)
        comp = snappy.compress(payload)
        header = fmt.encode_log_header(0, last_seq + 1, 1, time.time_ns() // 1000, new_head, comp)
        welcome = frames.Welcome(
            frames.PROTOCOL_VERSION, uuid.uuid4().bytes, db_id, last_seq + 1, 1, 1000
        )
        self.reply = frames.encode_welcome(welcome) + frames.encode_record(header, comp)
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(frames.HEADER_SIZE + 92)
                    conn.sendall(self.reply)
                    conn.recv(1)  # until the replica closes
                except OSError:
                    pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_record_with_an_oversized_key_stops_replication_with_a_named_error(
    tmp_path: Path, procs: Procs
) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(20, batch=10)
        port = root.port
        r = start_replica(procs, tmp_path / "r1", [port], repl=False, name="r1")
        wait_for(lambda: status(r.http)["seq"] >= 20, 60, "replica at seq 20")
        seq, head = root.store.head()
        db_id = uuid.UUID(root.store.db_id).bytes
        alg = chainhash.code(root.store.chain_hash)
    forger = _ForgingSource(port, seq, head, db_id, b"x" * 600, alg)
    try:
        wait_for(lambda: status(r.http)["replication_state"] == "failed", 60, "state failed")
        st = status(r.http)
        assert "invalid log record at seq 21" in st["replication_error"], st
        assert "600 bytes" in st["replication_error"], st
        seen = forger.connections
        _retry_window()
        assert forger.connections == seen, "the worker keeps reconnecting"
        assert r.proc.poll() is None
        assert status(r.http)["replication_state"] == "failed"
        assert status(r.http)["seq"] == 20
    finally:
        forger.close()
