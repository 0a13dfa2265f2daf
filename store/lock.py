"""One writer per store: an exclusive `flock` on ``DATA_DIR/lock`` holding the writer's pid.

Every process that writes a data directory (the root, a replica's worker, `mercury init`,
`mercury migrate`, a snapshot install or bootstrap) holds this lock for as long as it may
write. Two writers on one LMDB environment would not corrupt it (LMDB serialises write
transactions) but would interleave two histories in one log; the lock makes the second
writer fail at once with the holder's pid instead.

`flock` is tied to the open file, so the kernel releases it when the holder dies however
it dies: a stale ``lock`` file left by a killed process never blocks a restart (the pid in
it is only a message for the operator). A replica's parent takes the lock and hands the
open descriptor to its worker (`adopt`), so both hold one lock and a second replica on the
same directory fails before it starts a worker.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from types import TracebackType

from core.errors import StoreError, StoreNotFoundError
from store import layout

LOCK_FILE = "lock"


class StoreLockedError(StoreError):
    """Another live process writes this data directory; it can never succeed while it runs."""


def lock_path(data_dir: str) -> str:
    """Path of the writer lock of `data_dir`."""
    return os.path.join(data_dir, LOCK_FILE)


class WriterLock:
    """The exclusive writer lock of one data directory (release with `release` or `with`)."""

    def __init__(self, data_dir: str, fd: int) -> None:
        self.data_dir = data_dir
        self.fd = fd

    @classmethod
    def acquire(cls, data_dir: str, *, create: bool = True) -> WriterLock:
        """Take the lock of `data_dir` without waiting; the directory is created (0700)
        when missing if `create`, else that is StoreNotFoundError.

        Raises StoreLockedError naming the holder's pid when another process holds it.
        """
        if create:
            layout.make_data_dir(data_dir)
        elif not layout.exists(data_dir):
            raise StoreNotFoundError(
                f"no Mercury store in {data_dir!r}", hint="create one with `mercury init DATA_DIR`"
            )
        fd = os.open(lock_path(data_dir), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, layout.FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise StoreLockedError(
                f"data directory {data_dir!r} is locked by another writer "
                f"(pid {holder_pid(data_dir) or 'unknown'})",
                hint="stop that process first; one process writes a store",
            ) from None
        # Our pid for the operator; written after the lock is ours, so never over a holder's.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(data_dir, fd)

    @classmethod
    def adopt(cls, data_dir: str, fd: int) -> WriterLock:
        """The lock inherited from the parent as descriptor `fd` (same open file, so the
        same lock); raises StoreLockedError when `fd` does not hold it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StoreLockedError(
                f"inherited descriptor {fd} does not hold the lock of {data_dir!r}"
            ) from None
        return cls(data_dir, fd)

    def release(self) -> None:
        """Give the lock up (idempotent); the pid stays in the file, harmlessly."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> WriterLock:
        return self

    def __exit__(
        self,
        _t: type[BaseException] | None,
        _e: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.release()


def holder_pid(data_dir: str) -> int | None:
    """The pid written by the lock's current (or last) holder, if readable."""
    try:
        with open(lock_path(data_dir)) as f:
            return int(f.read().strip() or "0") or None
    except (OSError, ValueError):
        return None
