"""Format 1 → 2: per-owner usage counters, backfilled by recounting the data once.

Format 1 kept no usage counters; format 2 maintains them in every batch transaction
(`store/usage.py`). This step creates the ``usage`` sub-database and fills keys and bytes
from the value records' owners. Write counters (writes, duplicates, ...) have no history to
recover and start at zero.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mercury import failpoints
from migrations.plan import Step
from store import codec, layout
from store.usage import Usage, stored_bytes, usage_key


def _apply(store: Any, txn: Any, progress: Callable[[int], object]) -> None:
    usage_db = store.env.open_db(layout.USAGE, txn=txn, create=True)
    txn.drop(usage_db, delete=False)  # a clean slate: the step may have run before
    counts: dict[str, Usage] = {}
    for n, (key, rec) in enumerate(txn.cursor(db=store.dbs.data), 1):
        h = codec.decode_record_header(rec)
        u = counts.setdefault(h.owner, Usage())
        u.keys += 1
        u.bytes += stored_bytes(len(key), h.vlen, len(h.owner.encode()))
        if n % 10_000 == 0:
            progress(10_000)
            failpoints.hit("migrate.0002.mid_scan")
    for owner, u in counts.items():
        txn.put(usage_key(owner), u.encode(), db=usage_db)
    failpoints.hit("migrate.0002.before_commit")


STEP = Step(
    from_version=1,
    name="0002_usage_counters",
    description="create per-producer usage counters and backfill keys/bytes from the data",
    apply=_apply,
)
