"""Plain values that cross the store's API: ops in, results out."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple

from store.format import OP_DELETE, OP_EXPIRE, OP_SET

SET = OP_SET
DELETE = OP_DELETE
#: A delete that is an expiry: only the root's expirer submits it (`gateway/expirer.py`).
EXPIRE = OP_EXPIRE


class Status(StrEnum):
    """What `apply()` did with one op."""

    WRITTEN = "written"
    DUPLICATE = "duplicate"
    DELETED = "deleted"
    ABSENT = "absent"
    PRECONDITION_FAILED = "precondition_failed"
    #: An expiry (op EXPIRE) removed the key.
    EXPIRED = "expired"
    #: Never produced by the store: the gateway's batcher reports it for an op it dropped
    #: because a later op of the same batch (same key, no condition) replaced it before
    #: the commit; its seq is that later op's result seq.
    SUPERSEDED = "superseded"


#: Every status, the most frequent first (`status_counts` stops once all are counted).
_STATUSES = tuple(Status)


def status_counts(statuses: list[Status]) -> dict[Status, int]:
    """How many of each status `statuses` holds (statuses it lacks are left out).

    One `list.count` per status, which matches by identity first, stopping once every
    element is counted (one pass for a bulk load, all written) — not a Counter: an Enum
    member's hash is a Python-level call, which cost ~0.1-0.2 µs per op of every bulk
    request, on the event loop (answers) and again in the commit thread (metrics)."""
    out: dict[Status, int] = {}
    left = len(statuses)
    for st in _STATUSES:
        if not left:
            break
        n = statuses.count(st)
        if n:
            out[st] = n
            left -= n
    return out


class Op(NamedTuple):
    """One requested change.

    `expect_seq` makes the op conditional, evaluated inside the write transaction: the
    key's current version (seq of its last change, 0 when absent) must equal it —
    ``If-Match: "<seq>"`` is ``expect_seq=seq``, ``If-None-Match: *`` is ``expect_seq=0``.

    `deadline` (µs since the epoch, 0 = none) makes a set expire (format >= 7): the store
    indexes it and the root's expirer logs an EXPIRE op once it is due. A set without one
    clears the key's deadline. An EXPIRE removes the key only when it has a deadline (and
    `expect_seq`, which the expirer always gives, still matches); otherwise "absent".
    """

    op: int
    key: bytes
    value: bytes = b""
    owner: str = ""
    expect_seq: int | None = None
    deadline: int = 0


class Result(NamedTuple):
    """Outcome of one op.

    `seq`: the new seq for written/deleted; for duplicate, the seq at which the identical
    value was stored; for absent and precondition_failed, the key's current version (0 when
    absent).
    """

    status: Status
    seq: int


class ApplyResult(NamedTuple):
    """Outcome of one batch: `first_seq`..`last_seq` are the seqs it logged (both 0 when it
    changed nothing), `hash_head` the chain head after it, `results` one per op in order."""

    first_seq: int
    last_seq: int
    hash_head: bytes
    results: list[Result]


class Value(NamedTuple):
    """A value read from the store, with its version (seq of its last change)."""

    value: bytes
    seq: int
    owner: str
    #: The key's deadline (µs since the epoch), 0 when it does not expire.
    expires_us: int = 0


class LogRecord(NamedTuple):
    """One batch of the log as stored and as shipped: the 62-byte header and the
    compressed payload (see `store/format.py`)."""

    first_seq: int
    num_entries: int
    time_us: int
    hash_head: bytes
    header: bytes
    payload: bytes

    @property
    def last_seq(self) -> int:
        """Seq of the record's last entry."""
        return self.first_seq + self.num_entries - 1
