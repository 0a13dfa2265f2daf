"""Commits in flight, for the work that must give way to them (`CommitGate`).

On the root, one process holds the event loop (gateway, KT and memcached listeners) and
the thread that commits batches. A commit is mostly LMDB calls that release the GIL and
take it back; while the loop thread is busy with a long piece of work, such as the slices
of a million-key KT `get_bulk`, each take-back waits out the interpreter's switch interval
(5 ms), and a commit that does it a few hundred times is late by a second. Sliced bulk
work therefore waits, between two slices, for the commits in flight to end
(`net/tcp.py`): the commit thread then has the GIL to itself, and a heavy read costs write
acknowledgements nothing but the loop's turns between slices. Small requests are not held.

Thread-safe: `held()` runs in the committing thread, `idle()` on an event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator


class CommitGate:
    """Counts commits in flight; hands out futures done when none is."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        #: Commits begun since the gate was made (observability; tests).
        self.commits = 0
        #: Times a piece of work waited for commits to end (`idle` returned a future).
        self.waits = 0

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Around one commit (any thread)."""
        with self._lock:
            self._busy += 1
            self.commits += 1
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                waiters = self._waiters if self._busy == 0 else []
                if waiters:
                    self._waiters = []
            for loop, fut in waiters:
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
                    loop.call_soon_threadsafe(_finish, fut)

    def busy(self) -> bool:
        """True while a commit is in flight."""
        return self._busy > 0

    def idle(self) -> asyncio.Future[None] | None:
        """None when no commit is in flight; else a future of the running loop, done once
        none is."""
        with self._lock:
            if self._busy == 0:
                return None
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
            self.waits += 1
            return fut


def _finish(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
