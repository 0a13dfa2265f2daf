"""The LMDB environment of a node: its sub-databases and meta keys (the adapter to lmdb).

Sub-databases:

- ``data``   user key -> value record (`store/format.py`)
- ``chunks`` pieces of large values and large log payloads (page-sized)
- ``log``    first seq (u64 big-endian) -> log record, one per batch
- ``meta``   db id, format version, last seq, hash head, log bounds, and (format ≥ 2) one
  usage record per owner under ``usage:<owner>`` (`store/usage.py`) — in the same
  sub-database so that a small commit dirties one meta page, not two
- ``state``  named documents of the node, not replicated (up to format 4 the admin token
  hash; up to format 2 the ACL)
- ``idem``   idempotency keys -> first answer; from format 5 written through the log
  (`store/nodedocs.py`), expired per node
- ``docs``   (format >= 3) replicated documents (the ACL, audit records): name -> seq (u64)
  of the log entry that wrote it ++ the document, changed only through the log
  (`store/docs.py`)
- ``expiry`` (format >= 7) the deadline index: ``b"d"`` + deadline (u64 BE) + key -> empty
  (due keys in deadline order) and ``b"k"`` + key -> deadline (u64), changed in the same
  transaction as the key by every node from the log (`store/expiry.py`)
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import lmdb

from core.errors import StoreNotFoundError

DATA = b"data"
CHUNKS = b"chunks"
LOG = b"log"
META = b"meta"
STATE = b"state"
IDEM = b"idem"
DOCS = b"docs"
EXPIRY = b"expiry"
ALL_DBS = (DATA, CHUNKS, LOG, META, STATE, IDEM, DOCS, EXPIRY)

K_DB_ID = b"db_id"
K_FORMAT = b"format_version"
K_LAST_SEQ = b"last_seq"
K_HASH_HEAD = b"hash_head"
K_LOG_FIRST = b"log_first_seq"
K_LOG_BASE_HASH = b"log_base_hash"
K_CREATED = b"created_us"
#: The chain hash's name (format >= 6; `store/chainhash.py`).
K_CHAIN_HASH = b"chain_hash"

U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
BE64 = struct.Struct(">Q")

DEFAULT_MAP_SIZE = 64 << 30
MAX_READERS = 1024


@dataclass(frozen=True, slots=True)
class Dbs:
    """Handles of the sub-databases of one open environment."""

    data: Any
    chunks: Any
    log: Any
    meta: Any
    state: Any
    idem: Any
    #: None only in a read-only view of a format-2 store, which has no ``docs`` yet.
    docs: Any
    #: None only in a read-only view of a store older than format 7 (`store/expiry.py`).
    expiry: Any


#: A data directory and the files in it belong to the node's user alone: the store holds
#: every producer's values, the ACL and the admin token's hash.
DIR_MODE = 0o700
FILE_MODE = 0o600


def make_data_dir(path: str) -> None:
    """Create data directory `path` (and its parents) if missing, and make it `DIR_MODE`
    whatever the umask or whoever created it empty."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    os.chmod(path, DIR_MODE)


def data_file(path: str) -> str:
    """Path of the LMDB data file of the store in directory `path`."""
    return os.path.join(path, "data.mdb")


def exists(path: str) -> bool:
    """True when directory `path` holds a store."""
    return os.path.isfile(data_file(path))


def open_env(
    path: str,
    *,
    readonly: bool = False,
    map_size: int = DEFAULT_MAP_SIZE,
    sync: bool = True,
    meta_sync: bool = True,
    create: bool = False,
) -> tuple[Any, Dbs]:
    """Open the environment in `path` and its sub-databases.

    `sync=False` trades durability of the last commits for speed (tests and benchmarks of
    non-durable paths only). `meta_sync=False` (with `sync`) writes each commit's data
    pages durably but leaves its meta page to the next commit's sync (LMDB's
    MDB_NOMETASYNC): a system crash may undo the last commit, never corrupt the store.
    Raises StoreNotFoundError when there is no store and not `create`.
    """
    if not create and not exists(path):
        raise StoreNotFoundError(
            f"no Mercury store in {path!r}", hint="create one with `mercury init DATA_DIR`"
        )
    if create:
        make_data_dir(path)
    env = lmdb.open(
        path,
        mode=FILE_MODE,  # data.mdb and lock.mdb: the node's data, for its user only
        map_size=map_size,
        max_dbs=len(ALL_DBS) + 2,
        max_readers=MAX_READERS,
        readonly=readonly,
        sync=sync,
        metasync=sync and meta_sync,
        readahead=False,
        meminit=False,
        lock=True,
    )
    handles = [_open_db(env, name, readonly) for name in ALL_DBS]
    return env, Dbs(*handles)


def _open_db(env: Any, name: bytes, readonly: bool) -> Any:
    try:
        return env.open_db(name, create=not readonly)
    except lmdb.NotFoundError:
        if name in (DOCS, EXPIRY):  # an older store opened read-only (to migrate or inspect)
            return None
        raise
