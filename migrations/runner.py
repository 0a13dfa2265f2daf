"""Running migrations: each step in its own write transaction with the new format version.

Crash-safe and idempotent: a step's changes and the version bump commit together, so a
SIGKILL leaves the store at the old version with none of the step's changes, and a rerun
starts that step again from scratch.
"""

from __future__ import annotations

from collections.abc import Callable

from migrations import (
    m0002_usage_counters,
    m0003_replicated_docs,
    m0004_key_checksum,
    m0005_root_state_in_log,
    m0006_chain_hash,
    m0007_expiry,
)
from migrations.plan import Step, plan
from store.migration import data_entries, run_step
from store.version import CURRENT_FORMAT, read_format_version

#: Every known step, in order. Format 1 is the initial format.
STEPS: tuple[Step, ...] = (
    m0002_usage_counters.STEP,
    m0003_replicated_docs.STEP,
    m0004_key_checksum.STEP,
    m0005_root_state_in_log.STEP,
    m0006_chain_hash.STEP,
    m0007_expiry.STEP,
)


def pending(path: str) -> list[Step]:
    """The steps `migrate(path)` would apply (empty when the store is current)."""
    return plan(read_format_version(path), CURRENT_FORMAT, STEPS)


def work_units(path: str) -> int:
    """Progress units of a full migration (data records scanned per step)."""
    steps = pending(path)
    return data_entries(path) * len(steps) if steps else 0


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
        run_step(path, step.from_version, step.to_version, step.apply, tick)
    return steps
