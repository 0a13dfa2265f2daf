"""Bootstrap: fetch a snapshot from a source (resumable) and install it as this node's store.

The download goes to ``DATA_DIR/.bootstrap/snapshot.part`` with the source's offer beside it
(``offer.json``: seq, hash head, db id, size, SHA-256). After a cut, the next attempt names
that SHA-256 and the bytes already held; a source that still keeps the snapshot continues
from there (otherwise it offers a new snapshot from byte 0 and the part file starts over).
The complete file is verified by `store.snapshot.install_snapshot` (size, SHA-256, db id,
seq, hash head) before it becomes the store; a file that fails is deleted and fetched again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid

from core.errors import CorruptionError, DbIdMismatchError, ProtocolError
from net.tlsconf import TlsContexts
from replicator import frames
from replicator.client import refusal_error
from replicator.runtime import PROCESS, Runtime
from replicator.status import StatusBoard
from replicator.tcp import TcpTransport
from replicator.transport import PeerClosed, Transport
from store import layout
from store.snapshot import SnapshotInfo, install_snapshot
from store.store import CURRENT_FORMAT, Store

log = logging.getLogger("mercury.replication.bootstrap")

CONNECT_TIMEOUT = 5.0
#: No byte for this long (and no WAIT frame: those come every second) = a dead source.
IDLE_TIMEOUT = 30.0


def bootstrap_dir(data_dir: str) -> str:
    """Where a bootstrap download lives (inside DATA_DIR: same filesystem as the store)."""
    return os.path.join(data_dir, ".bootstrap")


def _paths(data_dir: str) -> tuple[str, str]:
    d = bootstrap_dir(data_dir)
    return os.path.join(d, "snapshot.part"), os.path.join(d, "offer.json")


def held(data_dir: str) -> tuple[frames.SnapshotOffer | None, int]:
    """The offer of a download in progress and how many bytes of it are on disk."""
    part, meta = _paths(data_dir)
    try:
        with open(meta) as f:
            raw = json.load(f)
        offer = frames.SnapshotOffer(
            raw["seq"],
            bytes.fromhex(raw["hash_head"]),
            bytes.fromhex(raw["db_id"]),
            raw["size"],
            bytes.fromhex(raw["sha256"]),
            0,
        )
        return offer, os.path.getsize(part)
    except (OSError, ValueError, KeyError):
        return None, 0


def complete(data_dir: str) -> bool:
    """True when a whole snapshot is downloaded and waits to be installed."""
    offer, have = held(data_dir)
    return offer is not None and have == offer.size


def discard(data_dir: str) -> None:
    """Forget a download (after install, or when it failed verification)."""
    for p in _paths(data_dir):
        with contextlib.suppress(OSError):
            os.unlink(p)


async def fetch(
    host: str,
    port: int,
    data_dir: str,
    *,
    node_id: bytes,
    db_id: bytes,
    board: StatusBoard,
    tls: TlsContexts | None = None,
    transport: Transport | None = None,
    keyspaces: tuple[bytes, ...] | None = None,
    runtime: Runtime = PROCESS,
) -> frames.SnapshotOffer:
    """Download (or finish downloading) a snapshot from `host:port` into DATA_DIR/.bootstrap,
    over `transport` (None: TCP, with mutual TLS when `tls`).

    The link is a bulk one (`Transport.connect(bulk=True)`): over TCP a blocking socket
    driven from worker threads, the snapshot's bytes spliced into the file (asyncio's
    stream machinery would cost most of the throughput, and nothing else shares this
    connection). Raises SnapshotTransferError when the transfer is cut (call again to
    resume), the source's RefusedError subclasses, and OSError when it is unreachable.
    A filtered replica names its `keyspaces` (a filtered source refuses others); the
    snapshot is then one its source derived for them (`store/prune.py`).
    `runtime`: where its file work runs (`replicator/runtime.py`).
    """
    transport = transport or TcpTransport(tls)
    part, meta = _paths(data_dir)
    await runtime.offload(_prepare, data_dir)
    offer, have = held(data_dir)
    if offer is not None and have == offer.size:
        return offer

    def state(name: str) -> None:
        board.update(state=name, source=f"{host}:{port}")

    link = await transport.connect(host, port, timeout=CONNECT_TIMEOUT, bulk=True)
    try:
        hello = frames.Hello(
            frames.PROTOCOL_VERSION,
            frames.MODE_SNAPSHOT,
            0 if keyspaces is None else frames.OPT_KEYSPACES,
            node_id,
            db_id,
            0,
            0,
            have if offer is not None else 0,
            offer.sha256 if offer is not None else frames.ZERO_SHA,
        )
        request = frames.encode_hello(hello)
        if keyspaces is not None:
            request += frames.encode_keyspaces(frames.Keyspaces(frames.ZERO_SHA, keyspaces))
        await link.send(request, IDLE_TIMEOUT)
        while True:
            try:
                ftype, _, raw, _ = await link.recv(IDLE_TIMEOUT)
            except PeerClosed as err:
                raise ProtocolError("connection closed by the source") from err
            body = bytes(raw)
            if ftype == frames.REFUSE:
                raise refusal_error(frames.decode_refuse(body))
            if ftype == frames.WAIT:
                state("bootstrap-waiting")
            elif ftype == frames.SNAPSHOT:
                new = frames.decode_snapshot(body)
                if db_id != frames.ZERO_ID and new.db_id != db_id:
                    raise DbIdMismatchError(f"{host}:{port} offered another store's snapshot")
                break
            elif ftype != frames.WELCOME:
                raise ProtocolError(f"unexpected frame type {ftype} before a snapshot")
            elif db_id != frames.ZERO_ID and (theirs := frames.decode_welcome(body).db_id) != db_id:
                # A re-bootstrap must fetch our own store's history, never another's.
                raise DbIdMismatchError(
                    f"source {host}:{port} holds db {uuid.UUID(bytes=theirs)}, "
                    f"this replica holds {uuid.UUID(bytes=db_id)}"
                )
        state("bootstrapping")
        if new.offset == 0:
            with open(meta, "w") as f:
                json.dump(
                    {
                        "seq": new.seq,
                        "hash_head": new.hash_head.hex(),
                        "db_id": new.db_id.hex(),
                        "size": new.size,
                        "sha256": new.sha256.hex(),
                    },
                    f,
                )
        elif offer is None or new.sha256 != offer.sha256 or new.offset != have:
            raise ProtocolError("source resumed a snapshot transfer from the wrong place")
        log.info(
            "fetching snapshot at seq %d from %s:%d: bytes %d..%d",
            new.seq,
            host,
            port,
            new.offset,
            new.size,
        )
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if new.offset == 0 else 0)
        fd = os.open(part, flags, 0o600)
        try:
            os.lseek(fd, new.offset, os.SEEK_SET)
            await link.recv_file(fd, new.size - new.offset, idle_timeout=IDLE_TIMEOUT)
        finally:
            os.close(fd)
        return new._replace(offset=0)
    finally:
        await link.close()


def _prepare(data_dir: str) -> None:
    layout.make_data_dir(data_dir)  # 0700 before any of the store's bytes arrive
    os.makedirs(bootstrap_dir(data_dir), exist_ok=True)


def install(data_dir: str, offer: frames.SnapshotOffer) -> Store:
    """Install the downloaded snapshot as the store of `data_dir` (which holds none).

    Raises CorruptionError (and discards the download) when it fails verification.
    """
    part, _ = _paths(data_dir)
    # Durable before it becomes the store: LMDB's commits only sync the pages they write.
    fd = os.open(part, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    info = SnapshotInfo(
        db_id=str(uuid.UUID(bytes=offer.db_id)),
        format_version=CURRENT_FORMAT,
        seq=offer.seq,
        hash_head=offer.hash_head.hex(),
        log_first_seq=0,
        sha256=offer.sha256.hex(),
        size=offer.size,
        created_us=0,
    )
    try:
        store = install_snapshot(part, data_dir, info)
    except CorruptionError:
        discard(data_dir)
        raise
    discard(data_dir)
    log.info("installed snapshot at seq %d", offer.seq)
    return store
