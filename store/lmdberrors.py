"""What an LMDB failure means for a write, said in Mercury's errors.

A full disk does not always come back from LMDB as ENOSPC: a short write while flushing
dirty pages is reported as EIO ("mdb_txn_commit: Input/output error"). A store that cannot
grow is *full* (507, retryable once space is freed) — not a generic 503 — so an EIO on a
write is checked against the free space of the store's filesystem: nearly none left means
the disk is full, otherwise the disk itself failed and the answer says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import lmdb

from core.errors import StoreError, StoreFullError

#: Below this much free space on the store's filesystem an I/O error is a full disk.
DISK_FULL_BELOW = 64 << 20
_EIO_TEXT = os.strerror(5)  # errno.EIO; py-lmdb passes only the message, not the code


def free_bytes(path: str) -> int | None:
    """Free bytes for unprivileged writers on the filesystem of `path` (None if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def translate(err: lmdb.Error, path: str, what: str) -> StoreError:
    """The Mercury error for LMDB error `err` raised while `what` in the store at `path`."""
    if isinstance(err, lmdb.MapFullError):
        return StoreFullError(
            f"store full: the LMDB map has no room while {what}",
            hint="raise the map size or free space; nothing of the write was applied",
        )
    free = free_bytes(path)
    if isinstance(err, lmdb.DiskError) or (
        _EIO_TEXT in str(err) and free is not None and free < DISK_FULL_BELOW
    ):
        return StoreFullError(
            f"store full: disk full ({free if free is not None else '?'} bytes free) while "
            f"{what} ({err})",
            hint="free disk space on the data directory's filesystem; nothing of the write "
            "was applied",
        )
    return StoreError(f"LMDB error while {what}: {err}")


@contextmanager
def writing(path: str, what: str) -> Iterator[None]:
    """Translate LMDB errors raised inside the block (see `translate`)."""
    try:
        yield
    except lmdb.Error as err:
        raise translate(err, path, what) from err
