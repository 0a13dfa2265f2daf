"""Format 6 → 7: keys that expire.

Format 7 adds the ``expiry`` sub-database (the deadline index, `store/expiry.py`), the value
record's `FLAG_EXPIRES` bit and two log ops: 4 (a set with a deadline) and 5 (an expiry).
No key of an older store has a deadline, so there is nothing to rewrite: opening the store
for this step creates the empty sub-database, and the step records the version.

Order: a format-6 replica refuses a record holding op 4 or 5 (an invalid record, replication
stops), so migrate replicas before their root writes a key with a TTL; a migrated replica
applies a format-6 root's records unchanged (ops 1-3 did not change).
"""

from __future__ import annotations

from migrations.plan import Step
from store.migration import MigrationTxn, Progress


def _apply(mtx: MigrationTxn, progress: Progress) -> None:
    # Nothing to change: the empty deadline index is created when the step opens the
    # store, in the same transaction as the version bump.
    del mtx, progress


STEP = Step(
    from_version=6,
    name="0007_expiry",
    description="keys that expire: the (empty) deadline index; log ops 4 and 5",
    apply=_apply,
)
