"""Running migrations: each step in its own write transaction with the new format version.

Crash-safe and idempotent: a step's changes and the version bump commit together, so a
SIGKILL leaves the store at the old version with none of the step's changes, and a rerun
starts that step again from scratch.
"""

from __future__ import annotations

from collections.abc import Callable

from migrations import m0002_usage_counters
from migrations.plan import Step, plan
from store.layout import K_FORMAT, U32
from store.store import CURRENT_FORMAT, Store, read_format_version

#: Every known step, in order. Format 1 is the initial format.
STEPS: tuple[Step, ...] = (m0002_usage_counters.STEP,)


def pending(path: str) -> list[Step]:
    """The steps `migrate(path)` would apply (empty when the store is current)."""
    return plan(read_format_version(path), CURRENT_FORMAT, STEPS)


def work_units(path: str) -> int:
    """Progress units of a full migration (data records scanned per step)."""
    steps = pending(path)
    if not steps:
        return 0
    store = Store.open(path, check_format=False)
    try:
        with store.env.begin() as txn:
            return int(txn.stat(store.dbs.data)["entries"]) * len(steps)
    finally:
        store.close()


def migrate(
    path: str,
    *,
    progress: Callable[[int], object] | None = None,
    on_step: Callable[[Step], None] | None = None,
) -> list[Step]:
    """Apply every pending step to the store at `path`; return the steps applied."""
    steps = pending(path)
    tick = progress or (lambda n: None)
    for step in steps:
        if on_step:
            on_step(step)
        store = Store.open(path, check_format=False)
        try:
            with store.env.begin(write=True) as txn:
                current = U32.unpack(txn.get(K_FORMAT, db=store.dbs.meta))[0]
                if current != step.from_version:
                    continue  # another process migrated meanwhile
                step.apply(store, txn, tick)
                txn.put(K_FORMAT, U32.pack(step.to_version), db=store.dbs.meta)
        finally:
            store.close()
    return steps
