"""Snapshots: a compact single-file copy of a store, and installing one as a new node's store.

A snapshot file is an LMDB data file (``data.mdb`` image) written by LMDB's compacting copy
inside ONE read transaction, so it holds exactly the state at one seq. The read transaction
lives only while the copy is written — never while the file is transferred — because a
reader held across many commits makes LMDB grow the file (pages that reader may still see
cannot be reused by the commits meanwhile).

Beside it, ``<file>.json`` records what it holds: ``{"db_id", "format_version", "seq",
"hash_head", "log_first_seq", "sha256", "size", "created_us"}``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass

from core.errors import CorruptionError, StoreError, StoreExistsError
from store import layout
from store.layout import K_FORMAT, K_HASH_HEAD, K_LAST_SEQ, K_LOG_FIRST, U32, U64
from store.store import Store, now_us

_BLOCK = 1 << 20


@dataclass(frozen=True)
class SnapshotInfo:
    """What a snapshot file holds and how to verify it."""

    db_id: str
    format_version: int
    seq: int
    hash_head: str
    log_first_seq: int
    sha256: str
    size: int
    created_us: int

    def to_json(self) -> str:
        """The sidecar document."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SnapshotInfo:
        """Parse a sidecar document."""
        return cls(**json.loads(text))


def sidecar(path: str) -> str:
    """Path of the JSON sidecar of snapshot file `path`."""
    return path + ".json"


def make_snapshot(
    store: Store,
    out_path: str,
    progress: Callable[[int], object] | None = None,
    *,
    node_local: bool = False,
) -> SnapshotInfo:
    """Write a compact copy of `store` to `out_path` (+ its sidecar) and return its info.

    The seq and hash head are read in the same read transaction as the copy, so they
    describe the copied state exactly. `progress(n)` is told how many bytes were hashed.

    Unless `node_local` (a node's own backup), the node-local sub-database ``state`` is
    emptied in the copy, which is then compacted again: a snapshot sent to another node
    must not carry it, not even in freed pages. That costs a second copy of the file.
    Idempotency answers (``idem``) travel: they came through the log (format >= 5), and a
    replica bootstrapped from the snapshot must answer a retry as the root would.
    """
    tmp = out_path + ".partial"
    stage = out_path + ".stage"
    target = tmp if node_local else os.path.join(stage, "data.mdb")
    if not node_local:
        shutil.rmtree(stage, ignore_errors=True)
        layout.make_data_dir(stage)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, layout.FILE_MODE)
        try:
            with store.env.begin() as txn:
                meta = store.dbs.meta
                version = U32.unpack(txn.get(K_FORMAT, db=meta))[0]
                seq = U64.unpack(txn.get(K_LAST_SEQ, db=meta))[0]
                head = bytes(txn.get(K_HASH_HEAD, db=meta)).hex()
                first = U64.unpack(txn.get(K_LOG_FIRST, db=meta))[0]
                store.env.copyfd(fd, compact=True, txn=txn)
            if node_local:
                os.fsync(fd)
        finally:
            os.close(fd)
        if not node_local:
            _drop_node_local(stage, tmp)
    finally:
        if not node_local:
            shutil.rmtree(stage, ignore_errors=True)
    digest, size = file_sha256(tmp, progress)
    os.replace(tmp, out_path)
    info = SnapshotInfo(store.db_id, version, seq, head, first, digest, size, now_us())
    with open(sidecar(out_path), "w") as f:
        f.write(info.to_json())
    return info


def _drop_node_local(stage: str, out: str) -> None:
    """Empty ``state`` of the store copy in directory `stage`, then write its compacting
    copy (live pages only: the dropped documents' bytes are not in it) to `out`."""
    env, dbs = layout.open_env(stage, sync=False)  # a scratch copy: only `out` is synced
    try:
        with env.begin(write=True) as txn:
            txn.drop(dbs.state, delete=False)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, layout.FILE_MODE)
        try:
            env.copyfd(fd, compact=True)
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        env.close()


def file_sha256(path: str, progress: Callable[[int], object] | None = None) -> tuple[str, int]:
    """(hex SHA-256, size) of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            size += len(block)
            if progress:
                progress(len(block))
    return h.hexdigest(), size


def install_snapshot(
    snapshot_file: str,
    data_dir: str,
    info: SnapshotInfo,
    *,
    map_size: int = layout.DEFAULT_MAP_SIZE,
) -> Store:
    """Verify `snapshot_file` against `info` and make it the store of empty `data_dir`.

    The file is moved into place (same filesystem: put it inside `data_dir` first), the
    node-local documents of the source (``state``) are dropped, and the opened
    store is returned. Raises CorruptionError when the checksum, size, db id, seq or hash
    head do not match, StoreExistsError when `data_dir` already holds a store.
    """
    if layout.exists(data_dir):
        raise StoreExistsError(f"{data_dir!r} already holds a store; refusing to overwrite it")
    digest, size = file_sha256(snapshot_file)
    if (digest, size) != (info.sha256, info.size):
        raise CorruptionError(
            f"snapshot {snapshot_file!r} fails its checksum ({size} bytes, sha256 {digest})",
            hint="fetch the snapshot again",
        )
    layout.make_data_dir(data_dir)
    os.replace(snapshot_file, layout.data_file(data_dir))
    os.chmod(layout.data_file(data_dir), layout.FILE_MODE)
    store = Store.open(data_dir, map_size=map_size)
    seq, head = store.head()
    if store.db_id != info.db_id or seq != info.seq or head.hex() != info.hash_head:
        store.close()
        raise CorruptionError(
            f"snapshot content does not match its description (db id {store.db_id}, seq {seq})"
        )
    try:
        with store.env.begin(write=True) as txn:
            txn.drop(store.dbs.state, delete=False)
    except Exception as err:
        store.close()
        raise StoreError(
            f"could not reset node documents of the installed snapshot: {err}"
        ) from err
    return store
