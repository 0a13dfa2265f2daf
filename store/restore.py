"""Restoring a node's store from a `mercury snapshot` file.

A snapshot file is a ``data.mdb`` image with a sidecar ``<file>.json`` (`store/snapshot.py`).
Restoring checks the file against its sidecar (size, SHA-256, then the store it holds: its
format, db id, seq and hash head), installs it atomically in place of the data directory's
store, and keeps the store it replaces in ``DATA_DIR/.replaced-<ms>/`` (`store/setaside.py`).
The copy is written and synced beside the store first (``DATA_DIR/.restore-stage/``) and
renamed over ``data.mdb`` only once complete: an interrupted restore leaves either the old
store or the new one, and running it again finishes it.

A restored root goes back in time: replicas that applied seqs past the snapshot's hold
writes the root no longer has. So a root's restore writes one log record right after the
snapshot's seq, the replicated document ``restore`` (when, from which snapshot, after which
seq and hash head). That record makes the root's history differ from every such replica's
at a seq the replica holds, and the root's first heartbeat to a reconnecting replica
carries its hash head there: the replica stops as diverged on connect
(`replicator/divergence.py`) whatever the root's write rate, instead of waiting until the
root's heartbeats look too old. Replicas at or below the snapshot's seq hold a prefix of
the restored history and stream on from it, the ``restore`` record included.

Seeding a replica (`replica=True`) writes no record (a replica never writes its own) and
drops the source node's node-local documents, as a bootstrap does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass

from core.errors import CorruptionError, FormatError, StoreError
from store import layout, setaside
from store.batchwrite import now_us
from store.snapshot import SnapshotInfo, sidecar
from store.store import Store
from store.version import CURRENT_FORMAT

#: The replicated document a root's restore writes (see the module docstring).
RESTORE_DOC = "restore"
#: Where the snapshot is copied and checked before it replaces ``data.mdb``.
STAGE_DIR = ".restore-stage"
#: What a replica's worker leaves beside its store (`replicator/status.py`,
#: `replicator/bootstrap.py`): a root's restore refuses such a directory.
REPLICA_STATUS_FILE = "replication.json"
_BLOCK = 1 << 20


@dataclass(frozen=True)
class Restored:
    """What `restore` installed and what it replaced."""

    db_id: str
    #: the snapshot's seq and hash head
    seq: int
    hash_head: str
    snapshot_created_us: int
    #: the first seq the restored log retains (a replica below it must bootstrap)
    log_first_seq: int
    #: seq of the ``restore`` record (a root's restore), None for a replica's seed
    restore_seq: int | None
    #: the replaced store's db id and seq (None: there was none, or it could not be read)
    replaced_db_id: str | None
    replaced_seq: int | None
    #: the set-aside directory (name in DATA_DIR) holding the replaced store files
    set_aside: str | None

    def to_json(self) -> str:
        """One JSON object (what `mercury restore --json` prints)."""
        return json.dumps(asdict(self), sort_keys=True)


def read_info(snapshot_file: str) -> SnapshotInfo:
    """The sidecar of `snapshot_file`; a missing or unreadable one is a StoreError."""
    if not os.path.isfile(snapshot_file):
        # Named first: "no X.json beside the snapshot" misleads when the path is mistyped.
        raise StoreError(f"no snapshot file {snapshot_file!r}")
    path = sidecar(snapshot_file)
    try:
        with open(path) as f:
            return SnapshotInfo.from_json(f.read())
    except FileNotFoundError:
        raise StoreError(
            f"no {path!r} beside the snapshot: its checksum and position cannot be checked",
            hint="restore a file written by `mercury snapshot`, with its .json beside it",
        ) from None
    except (OSError, ValueError, TypeError) as err:
        raise StoreError(f"snapshot description {path!r} is unreadable: {err}") from None


def check_info(info: SnapshotInfo) -> None:
    """Refuse a snapshot of another format than this Mercury's (FormatError)."""
    if info.format_version != CURRENT_FORMAT:
        raise FormatError(
            f"snapshot is at format {info.format_version}; this Mercury restores format "
            f"{CURRENT_FORMAT} only",
            hint="restore it with the Mercury that wrote it (then `mercury migrate`)"
            if info.format_version < CURRENT_FORMAT
            else "restore it with a Mercury as new as the one that wrote it",
        )


def _copy_synced(src: str, dst: str) -> tuple[str, int]:
    """Copy `src` to `dst` (mode 0600), fsync it, return (hex SHA-256, size) of the bytes
    written: the installed copy is what the checksum covers, not just the source."""
    h = hashlib.sha256()
    size = 0
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, layout.FILE_MODE)
    try:
        with open(src, "rb") as f:
            while block := f.read(_BLOCK):
                h.update(block)
                size += len(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return h.hexdigest(), size


def _replaced(data_dir: str) -> tuple[str | None, int | None]:
    """(db id, seq) of the store in `data_dir`, (None, None) when there is none or it
    cannot be read (a damaged store is a reason to restore)."""
    if not layout.exists(data_dir):
        return None, None
    try:
        store = Store.open(data_dir, readonly=True, check_format=False)
    except Exception:  # any damage: the restore replaces it anyway
        return None, None
    try:
        return store.db_id, store.last_seq()
    finally:
        store.close()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def restore(
    snapshot_file: str,
    data_dir: str,
    *,
    replica: bool = False,
    map_size: int = layout.DEFAULT_MAP_SIZE,
    time_us: int | None = None,
) -> Restored:
    """Install `snapshot_file` as the store of `data_dir` (see the module docstring).

    The caller holds `data_dir`'s `store.lock.WriterLock`. Raises StoreError (no or
    unreadable sidecar; a replica's data directory for a root's restore), FormatError
    (another format) or CorruptionError (checksum, not a store, content not as described),
    and then leaves the data directory's store as it was.
    """
    info = read_info(snapshot_file)
    check_info(info)
    if not replica and os.path.exists(os.path.join(data_dir, REPLICA_STATUS_FILE)):
        raise StoreError(
            f"{data_dir} holds a replica's store: restoring a root there would leave its "
            "status file, and `mercury root` refuses a replica's store",
            hint="seed the replica with `mercury restore --replica`, or restore into the "
            "root's own DATA_DIR",
        )
    layout.make_data_dir(data_dir)
    stage = os.path.join(data_dir, STAGE_DIR)
    shutil.rmtree(stage, ignore_errors=True)
    layout.make_data_dir(stage)
    try:
        digest, size = _copy_synced(snapshot_file, layout.data_file(stage))
        if (digest, size) != (info.sha256, info.size):
            raise CorruptionError(
                f"snapshot {snapshot_file!r} fails its checksum: {size} bytes with sha256 "
                f"{digest}, its .json says {info.size} bytes with sha256 {info.sha256}",
                hint="take or fetch the snapshot again",
            )
        restore_seq = _prepare(stage, info, replica, map_size, time_us)
        replaced_db_id, replaced_seq = _replaced(data_dir)
        aside = None
        if layout.exists(data_dir):
            aside = setaside.new_dir(data_dir, setaside.REPLACED)
            for name in ("data.mdb", "lock.mdb"):
                src = os.path.join(data_dir, name)
                if os.path.exists(src):
                    os.replace(src, os.path.join(aside, name))
        os.replace(layout.data_file(stage), layout.data_file(data_dir))
        _fsync_dir(data_dir)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if replica:  # an unfinished bootstrap download of the replaced store must not resume
        shutil.rmtree(os.path.join(data_dir, ".bootstrap"), ignore_errors=True)
    return Restored(
        db_id=info.db_id,
        seq=info.seq,
        hash_head=info.hash_head,
        snapshot_created_us=info.created_us,
        log_first_seq=info.log_first_seq,
        restore_seq=restore_seq,
        replaced_db_id=replaced_db_id,
        replaced_seq=replaced_seq,
        set_aside=os.path.basename(aside) if aside else None,
    )


def _prepare(
    stage: str, info: SnapshotInfo, replica: bool, map_size: int, time_us: int | None
) -> int | None:
    """Open the staged copy, check it holds what `info` describes, then write the root's
    ``restore`` record or drop a replica's node-local documents; return the record's seq."""
    try:
        store = Store.open(stage, map_size=map_size)
    except StoreError:
        raise
    except Exception as err:  # LMDB refusing bytes that are not a store
        raise CorruptionError(f"snapshot is not a Mercury store: {err}") from None
    try:
        seq, head = store.head()
        if store.db_id != info.db_id or seq != info.seq or head.hex() != info.hash_head:
            raise CorruptionError(
                f"snapshot content does not match its .json: it holds db id {store.db_id} "
                f"at seq {seq} (hash head {head.hex()})",
                hint="take the snapshot again",
            )
        if replica:
            with store.env.begin(write=True) as txn:
                txn.drop(store.dbs.state, delete=False)
            return None
        t = time_us or now_us()
        body = {
            "restored_us": t,
            "after_seq": seq,
            "after_hash": head.hex(),
            "snapshot_sha256": info.sha256,
            "snapshot_created_us": info.created_us,
        }
        out = store.put_docs({RESTORE_DOC: json.dumps(body, sort_keys=True).encode()}, time_us=t)
        return out.last_seq
    finally:
        store.close()
