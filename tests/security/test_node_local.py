"""Nothing node-local leaves a node: a raw client asking a real root for a snapshot with an
all-zero db id gets the replicated data, never the ``state`` sub-database, not even in freed
pages. Since format 5 what a root needs travels on purpose: the admin token's hash is a
replicated document (like the producers' token hashes) and idempotency answers come
through the log, so the snapshot carries both."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

from replicator import frames
from store import layout
from store.store import Store
from testkit.procs import Procs, free_port, run_mercury, wait_http
from testkit.sockets import recv_exact

NODE_MARKER = b"node-marker-7b1e0c"


def fetch_raw_snapshot(port: int) -> bytes:
    """HELLO(snapshot, db id unknown) and read the offer and the whole file."""
    hello = frames.Hello(
        frames.PROTOCOL_VERSION, frames.MODE_SNAPSHOT, 0, uuid.uuid4().bytes, frames.ZERO_ID,
        0, 0, 0, frames.ZERO_SHA,
    )  # fmt: skip
    with socket.create_connection(("127.0.0.1", port), 5) as s:
        s.settimeout(30)
        s.sendall(frames.encode_hello(hello))
        while True:
            head = recv_exact(s, frames.HEADER_SIZE)
            h = frames.decode_header(head)
            body = recv_exact(s, h.length)
            if h.type == frames.SNAPSHOT:
                offer = frames.decode_snapshot(body)
                return recv_exact(s, offer.size - offer.offset)
            assert h.type in (frames.WELCOME, frames.WAIT), h.type


def test_snapshot_for_an_unknown_replica_carries_no_node_local_documents(
    tmp_path: Path, procs: Procs
) -> None:
    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    store = Store.open(str(data))
    try:
        admin = store.get_doc("admin_token_hash")
        assert admin is not None
        store.put_state("node-only", NODE_MARKER)
        db_id = store.db_id
    finally:
        store.close()
    gw, repl = free_port(), free_port()
    root = procs.start_mercury(
        "root", str(data), "--listen", f"127.0.0.1:{gw}", "--repl-listen", f"127.0.0.1:{repl}",
        name="root",
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{gw}/healthz", proc=root)

    raw = fetch_raw_snapshot(repl)
    assert NODE_MARKER not in raw
    got = tmp_path / "got"
    got.mkdir()
    (got / "data.mdb").write_bytes(raw)
    env, dbs = layout.open_env(str(got), readonly=True)
    try:
        with env.begin() as txn:
            assert list(txn.cursor(db=dbs.state)) == []
            assert bytes(txn.get(b"admin_token_hash", db=dbs.docs))[8:] == admin.body
            assert uuid.UUID(bytes=bytes(txn.get(layout.K_DB_ID, db=dbs.meta))) == uuid.UUID(db_id)
    finally:
        env.close()
    # The node's own store is untouched, and its own backup keeps them.
    procs.terminate(root)
    backup = tmp_path / "backup.mdb"
    assert run_mercury("snapshot", str(data), str(backup)).returncode == 0
    assert NODE_MARKER in backup.read_bytes()
