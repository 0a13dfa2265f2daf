"""Migration planning: a pure function of versions and the known steps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.errors import FormatError, NewerFormatError
from store.migration import StepFn

# A step's `apply(mtx, progress)` runs inside the step's one write transaction and sees
# only the `store.migration.MigrationTxn` seam.


@dataclass(frozen=True)
class Step:
    """One on-disk format migration from `from_version` to `from_version + 1`."""

    from_version: int
    name: str
    description: str
    apply: StepFn

    @property
    def to_version(self) -> int:
        """The format version the store has after this step."""
        return self.from_version + 1


def plan(current: int, target: int, steps: Sequence[Step]) -> list[Step]:
    """The steps that take a store from format `current` to `target`, in order.

    Raises NewerFormatError when `current > target` (never downgrade) and FormatError when
    a step of the path is missing.
    """
    if current > target:
        raise NewerFormatError(
            f"store format {current} is newer than this Mercury's {target}",
            hint="run a Mercury release that knows this format",
        )
    by_from = {s.from_version: s for s in steps}
    out = []
    for v in range(current, target):
        step = by_from.get(v)
        if step is None:
            raise FormatError(f"no migration from format {v} to {v + 1}")
        out.append(step)
    return out
