"""Cross-process commit wake-up: a writer pings every replication source on the same store.

A source binds a Linux abstract-namespace unix datagram socket (no path-length limit, gone
when the process dies) and drops a marker file named after it in ``DATA_DIR/notify/``. A
process that commits to the store (`install_pinger`) sends one byte to every marker's
socket after each commit; markers whose socket refuses are stale and removed. Sources still
run a slow safety poll (`POLL_SECONDS`) in case a ping is lost — never a busy poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Callable

from store.store import Store

POLL_SECONDS = 1.0


def notify_dir(data_dir: str) -> str:
    """Directory of the wake-up markers of the store in `data_dir`."""
    return os.path.join(data_dir, "notify")


def ping_all(data_dir: str) -> None:
    """Wake every source listening on the store in `data_dir` (never raises)."""
    d = notify_dir(data_dir)
    try:
        names = os.listdir(d)
    except OSError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        for name in names:
            try:
                s.sendto(b"!", "\0" + name)
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(d, name))
            except OSError:
                pass  # buffer full: the listener has a wake-up pending anyway


def install_pinger(store: Store) -> None:
    """Make every commit of `store` in this process wake sources in other processes."""
    path = store.path
    store.add_commit_listener(lambda _seq: ping_all(path))


class WakeListener:
    """Receives pings for the store in `data_dir` and calls `on_wake` on the event loop."""

    def __init__(self, data_dir: str, on_wake: Callable[[], None]) -> None:
        self._dir = notify_dir(data_dir)
        self._name = f"mercury-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._on_wake = on_wake
        self._sock: socket.socket | None = None

    def start(self) -> None:
        """Bind the socket and register the marker."""
        os.makedirs(self._dir, exist_ok=True)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        s.bind("\0" + self._name)
        self._sock = s
        asyncio.get_running_loop().add_reader(s.fileno(), self._drain)
        with open(os.path.join(self._dir, self._name), "w"):
            pass

    def _drain(self) -> None:
        assert self._sock is not None
        while True:
            try:
                self._sock.recv(64)
            except (BlockingIOError, OSError):
                break
        self._on_wake()

    def stop(self) -> None:
        """Unregister and close."""
        if self._sock is None:
            return
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._sock.close()
        self._sock = None
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self._dir, self._name))
