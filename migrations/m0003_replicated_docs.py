"""Format 2 → 3: replicated documents; the ACL leaves the node-local ``state``.

Format 3 adds the ``docs`` sub-database and the log entry op 3 (`store/docs.py`). Until
format 2 the ACL was the node document ``acl`` in ``state``, so replicas never had it and a
promoted replica had no producers. This step writes that document through the log as the
replicated document ``acl`` (one log record of its own, so replicas that follow this root
receive it) and deletes it from ``state``. The admin token's hash stays node-local.

A replica's ``state`` holds no ``acl`` (an installed snapshot drops ``state``), so
migrating a replica logs nothing and its log stays identical to its root's; it receives the
root's record by replication.
"""

from __future__ import annotations

import time

from core import failpoints
from migrations.plan import Step
from store.migration import MigrationTxn, Progress

#: The ACL's name, in ``state`` up to format 2 and in ``docs`` from format 3 on.
ACL = "acl"


def _apply(mtx: MigrationTxn, progress: Progress) -> None:
    raw = mtx.get_state(ACL)
    if raw:
        mtx.log_docs({ACL: raw}, time.time_ns() // 1000)
    mtx.delete_state(ACL)
    failpoints.hit("migrate.0003.before_commit")


STEP = Step(
    from_version=2,
    name="0003_replicated_docs",
    description="replicated documents: move the ACL from the node-local state into the log",
    apply=_apply,
)
