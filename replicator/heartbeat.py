"""Where a source's heartbeats come from: the root's clock, or the newest upstream one.

Heartbeats never touch the store's log (a duplicate-only workload writes ~0 bytes): the
root's source makes them from its clock, head seq and hash head; a replica's source relays
the newest heartbeat its client received, unchanged, so lag stays relative to the root at any
depth and a replica at any depth can compare its own hash head with the root's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from replicator.frames import Heartbeat
from store.store import Store


class HeartbeatSource(Protocol):
    """What a replication source sends in its HEARTBEAT frames."""

    interval_ms: int

    def current(self) -> Heartbeat | None:
        """The heartbeat to send now, or None when there is nothing to say yet."""


class RootHeartbeat:
    """The root's heartbeat: its wall clock, head seq and hash head at the moment of
    sending (seq and head read in one transaction)."""

    def __init__(
        self, store: Store, interval_ms: int = 1000, now_us: Callable[[], int] | None = None
    ) -> None:
        self._store = store
        self.interval_ms = interval_ms
        #: Wall-clock microseconds (a simulation's virtual clock: `replicator/runtime.py`).
        self._now_us = now_us or (lambda: time.time_ns() // 1000)

    def current(self) -> Heartbeat:
        """A fresh heartbeat."""
        seq, head = self._store.head()
        return Heartbeat(self._now_us(), seq, self.interval_ms, 0, head)


class RelayedHeartbeat:
    """The newest heartbeat received from upstream; `on_new` is called when it changes."""

    def __init__(self) -> None:
        self.latest: Heartbeat | None = None
        self.interval_ms = 1000
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, cb: Callable[[], None]) -> None:
        """Call `cb()` (on the event loop) whenever a newer heartbeat arrives."""
        self._listeners.append(cb)

    def update(self, hb: Heartbeat) -> bool:
        """Record `hb`; True when it is newer than the one held."""
        if self.latest is not None and hb.time_us <= self.latest.time_us:
            return False
        self.latest = hb
        self.interval_ms = hb.interval_ms or self.interval_ms
        for cb in self._listeners:
            cb()
        return True

    def current(self) -> Heartbeat | None:
        """The newest upstream heartbeat (None before the first one)."""
        return self.latest
