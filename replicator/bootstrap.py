"""Bootstrap: fetch a snapshot from a source (resumable) and install it as this node's store.

The download goes to ``DATA_DIR/.bootstrap/snapshot.part`` with the source's offer beside it
(``offer.json``: seq, hash head, db id, size, SHA-256). After a cut, the next attempt names
that SHA-256 and the bytes already held; a source that still keeps the snapshot continues
from there (otherwise it offers a new snapshot from byte 0 and the part file starts over).
The complete file is verified by `store.snapshot.install_snapshot` (size, SHA-256, db id,
seq, hash head) before it becomes the store; a file that fails is deleted and fetched again.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import socket
import ssl
import struct
import uuid
from collections.abc import Callable

from core.errors import CorruptionError, DbIdMismatchError, ProtocolError, SnapshotTransferError
from net.tlsconf import TlsContexts
from replicator import frames
from replicator.client import refusal_error
from replicator.status import StatusBoard
from store import layout
from store.snapshot import SnapshotInfo, install_snapshot
from store.store import CURRENT_FORMAT, Store

log = logging.getLogger("mercury.replication.bootstrap")

_CHUNK = 1 << 20
_F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, Linux; Python < 3.10 lacks the name
CONNECT_TIMEOUT = 5.0
_SOCK_BUF = 4 << 20
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
) -> frames.SnapshotOffer:
    """Download (or finish downloading) a snapshot from `host:port` into DATA_DIR/.bootstrap.

    The transfer runs on a blocking socket in a worker thread (receive straight into a
    buffer, write to the file): asyncio's stream machinery would cost most of the
    throughput, and nothing else shares this connection. Raises SnapshotTransferError when
    the transfer is cut (call again to resume), the source's RefusedError subclasses, and
    OSError when it is unreachable.
    """
    loop = asyncio.get_running_loop()

    def state(name: str) -> None:
        loop.call_soon_threadsafe(lambda: board.update(state=name, source=f"{host}:{port}"))

    ctx = tls.client if tls is not None else None
    return await asyncio.to_thread(
        _fetch_blocking, host, port, data_dir, node_id, db_id, state, ctx
    )


def _connect(host: str, port: int, ctx: ssl.SSLContext | None = None) -> socket.socket:
    """A TCP connection with a large receive buffer, set before connecting so that the
    window scale is negotiated for it (a bulk transfer is window-bound otherwise); with
    `ctx`, mutual TLS (the source must present a certificate signed by our CA)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCK_BUF)
        sock.settimeout(CONNECT_TIMEOUT)
        sock.connect((host, port))
        if ctx is not None:
            sock = ctx.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise
    return sock


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ProtocolError("connection closed by the source")
        got += k
    return bytes(buf)


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    raw = _recv_exact(sock, frames.HEADER_SIZE)
    try:
        h = frames.decode_header(raw)
    except ValueError as err:
        raise ProtocolError(f"bad frame header: {err}") from err
    body = _recv_exact(sock, h.length) if h.length else b""
    if not frames.check_body(raw, body):
        raise ProtocolError(f"frame of type {h.type} fails its CRC")
    return h.type, body


def _fetch_blocking(
    host: str,
    port: int,
    data_dir: str,
    node_id: bytes,
    db_id: bytes,
    state: Callable[[str], None],
    ctx: ssl.SSLContext | None = None,
) -> frames.SnapshotOffer:
    part, meta = _paths(data_dir)
    layout.make_data_dir(data_dir)  # 0700 before any of the store's bytes arrive
    os.makedirs(bootstrap_dir(data_dir), exist_ok=True)
    offer, have = held(data_dir)
    if offer is not None and have == offer.size:
        return offer
    with _connect(host, port, ctx) as sock:
        sock.settimeout(IDLE_TIMEOUT)
        hello = frames.Hello(
            frames.PROTOCOL_VERSION,
            frames.MODE_SNAPSHOT,
            0,
            node_id,
            db_id,
            0,
            0,
            have if offer is not None else 0,
            offer.sha256 if offer is not None else frames.ZERO_SHA,
        )
        sock.sendall(frames.encode_hello(hello))
        while True:
            ftype, body = _read_frame(sock)
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
            _receive(sock, fd, new.size - new.offset)
        finally:
            os.close(fd)
        return new._replace(offset=0)


def _receive(sock: socket.socket, fd: int, count: int) -> None:
    """Move `count` bytes from `sock` to file `fd` at its position.

    Linux: splice socket -> pipe -> file, so the bytes never enter user space (this is
    what brings a transfer close to `cp`); elsewhere, recv_into a buffer and write.
    Raises SnapshotTransferError when the peer closes early or stalls.
    """
    left = count
    if isinstance(sock, ssl.SSLSocket):
        _receive_tls(sock, fd, count)
        return
    # Blocking fd (splice needs it) with a kernel receive timeout for stall detection.
    sock.setblocking(True)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", int(IDLE_TIMEOUT), 0))
    if hasattr(os, "splice"):
        r, w = os.pipe()
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(w, _F_SETPIPE_SZ, _CHUNK)
            while left:
                try:
                    k = os.splice(sock.fileno(), w, min(_CHUNK, left))
                except BlockingIOError as err:
                    raise SnapshotTransferError("snapshot transfer stalled") from err
                if k == 0:
                    break
                moved = 0
                while moved < k:
                    moved += os.splice(r, fd, k - moved)
                left -= k
        finally:
            os.close(r)
            os.close(w)
    else:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while left:
            try:
                k = sock.recv_into(view[: min(_CHUNK, left)])
            except (TimeoutError, BlockingIOError) as err:
                raise SnapshotTransferError("snapshot transfer stalled") from err
            if k == 0:
                break
            os.write(fd, view[:k])
            left -= k
    if left:
        raise SnapshotTransferError(
            f"snapshot transfer cut with {left} bytes to go", hint="retry resumes it"
        )


def _receive_tls(sock: ssl.SSLSocket, fd: int, count: int) -> None:
    """`_receive` over TLS: the bytes must be decrypted in user space, so no splice."""
    sock.settimeout(IDLE_TIMEOUT)
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    left = count
    while left:
        try:
            k = sock.recv_into(view[: min(_CHUNK, left)])
        except TimeoutError as err:
            raise SnapshotTransferError("snapshot transfer stalled") from err
        if k == 0:
            break
        os.write(fd, view[:k])
        left -= k
    if left:
        raise SnapshotTransferError(
            f"snapshot transfer cut with {left} bytes to go", hint="retry resumes it"
        )


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
