"""Format 1 → 2: per-owner usage counters, backfilled by recounting the data once.

Format 1 kept no usage counters; format 2 maintains them in every batch transaction
(`store/usage.py`, kept in the ``meta`` sub-database). This step fills keys and bytes from
the value records' owners. Write counters (writes, duplicates, ...) have no history to
recover and start at zero.
"""

from __future__ import annotations

from core import failpoints
from migrations.plan import Step
from store import codec
from store.migration import MigrationTxn, Progress
from store.usage import USAGE_PREFIX, Usage, stored_bytes, usage_key


def _apply(mtx: MigrationTxn, progress: Progress) -> None:
    for k in mtx.meta_keys(USAGE_PREFIX):  # a clean slate, whatever an interrupted run left
        mtx.delete_meta(k)
    counts: dict[str, Usage] = {}
    for n, (key, rec) in enumerate(mtx.data_records(), 1):
        h = codec.decode_record_header(rec)
        u = counts.setdefault(h.owner, Usage())
        u.keys += 1
        u.bytes += stored_bytes(len(key), h.vlen, h.owner_len)
        if n % 10_000 == 0:
            progress(10_000)
            failpoints.hit("migrate.0002.mid_scan")
    for owner, u in counts.items():
        mtx.put_meta(usage_key(owner), u.encode())
    failpoints.hit("migrate.0002.before_commit")


STEP = Step(
    from_version=1,
    name="0002_usage_counters",
    description="create per-producer usage counters and backfill keys/bytes from the data",
    apply=_apply,
)
