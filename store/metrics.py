"""Prometheus metrics the store itself owns (process-wide, as Prometheus clients are)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge

if TYPE_CHECKING:  # store.store imports this module (the CRC counter)
    from store.store import Store

CRC_FAILURES = Counter(
    "mercury_crc_failures_total", "Stored values or log records that failed their CRC on read"
)

#: Room left in the store's memory map and on its disk, read at scrape time (`watch`): a
#: write that finds either full fails (`StoreFullError`), so alerts watch both.
MAP_SIZE = Gauge("mercury_store_map_size_bytes", "Size of the store's LMDB memory map")
MAP_USED = Gauge(
    "mercury_store_map_used_bytes", "Bytes of the store's map in use (its last page, inclusive)"
)
DISK_SIZE = Gauge(
    "mercury_store_disk_size_bytes", "Size of the filesystem holding the store's data directory"
)
DISK_FREE = Gauge(
    "mercury_store_disk_free_bytes",
    "Bytes available (to this process's user) on the filesystem of the store's data directory",
)


def watch(store: Store) -> None:
    """Make the four gauges above read `store` (the process's one store) at each scrape."""

    def used() -> float:
        info, stat = store.env.info(), store.env.stat()
        return float((info["last_pgno"] + 1) * stat["psize"])

    def disk(free: bool) -> float:
        st = os.statvfs(store.path)
        return float((st.f_bavail if free else st.f_blocks) * st.f_frsize)

    MAP_SIZE.set_function(lambda: float(store.env.info()["map_size"]))
    MAP_USED.set_function(used)
    DISK_SIZE.set_function(lambda: disk(False))
    DISK_FREE.set_function(lambda: disk(True))
