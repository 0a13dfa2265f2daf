"""Format 1 → 2: per-owner usage counters, backfilled by recounting the data once.

Format 1 kept no usage counters; format 2 maintains them in every batch transaction
(`store/usage.py`, kept in the ``meta`` sub-database). This step fills keys and bytes from
the value records' owners. Write counters (writes, duplicates, ...) have no history to
recover and start at zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from core import failpoints
from migrations.plan import Step
from store import codec
from store.usage import USAGE_PREFIX, Usage, stored_bytes, usage_key


def _apply(store: Any, txn: Any, progress: Callable[[int], object]) -> None:
    meta = store.dbs.meta
    stale = [bytes(k) for k, _v in txn.cursor(db=meta) if bytes(k).startswith(USAGE_PREFIX)]
    for k in stale:  # a clean slate, whatever an interrupted earlier run left
        txn.delete(k, db=meta)
    counts: dict[str, Usage] = {}
    for n, (key, rec) in enumerate(txn.cursor(db=store.dbs.data), 1):
        h = codec.decode_record_header(rec)
        u = counts.setdefault(h.owner, Usage())
        u.keys += 1
        u.bytes += stored_bytes(len(key), h.vlen, h.owner_len)
        if n % 10_000 == 0:
            progress(10_000)
            failpoints.hit("migrate.0002.mid_scan")
    for owner, u in counts.items():
        txn.put(usage_key(owner), u.encode(), db=meta)
    failpoints.hit("migrate.0002.before_commit")


STEP = Step(
    from_version=1,
    name="0002_usage_counters",
    description="create per-producer usage counters and backfill keys/bytes from the data",
    apply=_apply,
)
