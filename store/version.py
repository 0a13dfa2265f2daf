"""The store's format version: which one this code writes, reading it, refusing others."""

from __future__ import annotations

import lmdb

from core.errors import CorruptionError, NewerFormatError, PendingMigrationsError
from store import layout
from store.layout import K_FORMAT, U32

#: Format written by this code. Format 1 had no usage counters, format 2 no replicated
#: documents, format 3 value records whose CRC left the key out, format 4 kept the admin
#: token's hash and idempotency answers out of the log, format 5 chained every log with
#: BLAKE2b-256 without naming it, format 6 had no keys that expire (see migrations/).
CURRENT_FORMAT = 7


def read_format_version(path: str) -> int:
    """The format version recorded in the store at `path` (opens it briefly, read-only)."""
    if not layout.exists(path):
        layout.open_env(path)  # raises StoreNotFoundError with its hint
        raise AssertionError("unreachable")
    env = lmdb.open(
        path,
        readonly=True,
        mode=layout.FILE_MODE,  # it may create lock.mdb
        max_dbs=len(layout.ALL_DBS) + 2,
        lock=True,
        map_size=layout.DEFAULT_MAP_SIZE,
    )
    try:
        with env.begin() as txn:
            meta = env.open_db(layout.META, txn=txn, create=False)
            raw = txn.get(K_FORMAT, db=meta)
            if raw is None:
                raise CorruptionError(f"store in {path!r} records no format version")
            return int(U32.unpack(raw)[0])
    finally:
        env.close()


def ensure_current_format(path: str, version: int) -> None:
    """Refuse a store whose format differs from `CURRENT_FORMAT`, saying what to run."""
    if version < CURRENT_FORMAT:
        raise PendingMigrationsError(
            f"store in {path!r} is at format {version}; this Mercury needs {CURRENT_FORMAT}",
            hint=f"run `mercury migrate {path}` (`--dry-run` lists the steps)",
        )
    if version > CURRENT_FORMAT:
        raise NewerFormatError(
            f"store in {path!r} is at format {version}, newer than this Mercury ({CURRENT_FORMAT})",
            hint="run a Mercury release that knows this format; never downgrade a store",
        )
