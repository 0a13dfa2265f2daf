"""Format 4 → 5: everything a root needs lives in the log.

Format 5 logs the admin token's hash as the replicated document ``admin_token_hash`` and
each idempotency answer as an op-3 entry of its batch's record (`store/nodedocs.py`), so a
replica holds all a root needs and can be promoted (`mercury promote`). Until format 4 the
admin token's hash was the node document ``admin_token_hash`` in ``state``: this step
writes it through the log (one record of its own, so replicas that follow this root
receive it) and deletes it from ``state``.

Answers a format-4 root stored stay in its ``idem`` (same record layout) and expire as
before; they were never logged, so replicas do not hold them. A replica's ``state`` holds
no admin hash (an installed snapshot drops ``state``): migrating a replica logs nothing,
its log stays identical to its root's and it receives the root's record by replication.
"""

from __future__ import annotations

import time

from core import failpoints
from migrations.plan import Step
from store.migration import MigrationTxn, Progress

#: The admin token hash's name, in ``state`` up to format 4 and in ``docs`` from 5 on.
ADMIN_HASH = "admin_token_hash"


def _apply(mtx: MigrationTxn, progress: Progress) -> None:
    raw = mtx.get_state(ADMIN_HASH)
    if raw:
        mtx.log_docs({ADMIN_HASH: raw}, time.time_ns() // 1000)
    mtx.delete_state(ADMIN_HASH)
    failpoints.hit("migrate.0005.before_commit")


STEP = Step(
    from_version=4,
    name="0005_root_state_in_log",
    description="the admin token's hash and idempotency answers in the log: move the "
    "admin hash from the node-local state into a replicated document",
    apply=_apply,
)
