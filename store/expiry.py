"""The deadline index (format >= 7): which keys expire, and when.

The ``expiry`` sub-database holds two entries per expiring key, changed in the same write
transaction as the key itself by whatever applies the change (the root's `apply_ops`, a
replica's `apply_entries`, through `batchwrite.ValueChunks`):

- ``b"d"`` + deadline (u64 big-endian, µs since the epoch) + key -> empty: the keys in
  deadline order, so the root's expirer finds the due ones with one cursor walk;
- ``b"k"`` + key -> deadline (u64 little-endian): the deadline of one key, for reads
  (``Expires``) and to remove its ``d`` entry when the key changes.

Every node maintains it from the log, so a restarted root, a promoted replica or an HA
successor knows every deadline without a scan; only the root acts on it (`gateway/expirer.py`).
A value record whose key has a deadline carries `format.FLAG_EXPIRES`, so a change of a key
without one never looks here.
"""

from __future__ import annotations

from typing import Any

from store.layout import BE64, U64

BY_DEADLINE = b"d"
BY_KEY = b"k"


def get(txn: Any, db: Any, key: bytes) -> int:
    """The deadline of `key` (µs), 0 when it has none."""
    raw = txn.get(BY_KEY + key, db=db)
    return 0 if raw is None else int(U64.unpack(raw)[0])


def put(txn: Any, db: Any, key: bytes, deadline_us: int) -> None:
    """Give `key` the deadline `deadline_us` (the caller cleared any earlier one)."""
    txn.put(BY_KEY + key, U64.pack(deadline_us), db=db)
    txn.put(BY_DEADLINE + BE64.pack(deadline_us) + key, b"", db=db)


def clear(txn: Any, db: Any, key: bytes) -> None:
    """Remove the deadline of `key` (a no-op when it has none)."""
    raw = txn.pop(BY_KEY + key, db=db)
    if raw is not None:
        txn.delete(BY_DEADLINE + bytes(raw)[::-1] + key, db=db)  # LE -> BE: same 8 bytes


def due(txn: Any, db: Any, now_us: int, limit: int) -> list[tuple[bytes, int]]:
    """Up to `limit` (key, deadline) whose deadline is at or before `now_us`, earliest
    first."""
    out: list[tuple[bytes, int]] = []
    cur = txn.cursor(db=db)
    if not cur.set_range(BY_DEADLINE):
        return out
    for k in cur.iternext(values=False):
        if len(out) >= limit or k[:1] != BY_DEADLINE:
            break
        deadline = BE64.unpack_from(k, 1)[0]
        if deadline > now_us:
            break
        out.append((bytes(k[9:]), int(deadline)))
    return out


def count_due(txn: Any, db: Any, now_us: int, cap: int) -> int:
    """How many deadlines are at or before `now_us`, counted up to `cap`."""
    return len(due(txn, db, now_us, cap))


def next_deadline(txn: Any, db: Any) -> int:
    """The earliest deadline of any key (µs), 0 when none expires."""
    cur = txn.cursor(db=db)
    if not cur.set_range(BY_DEADLINE):
        return 0
    k = cur.key()
    if k[:1] != BY_DEADLINE:
        return 0
    return int(BE64.unpack_from(k, 1)[0])


def check(txn: Any, db: Any, flagged: set[bytes]) -> list[str]:
    """Problems of the index against `flagged`, the keys whose record carries
    `FLAG_EXPIRES`: each has exactly one deadline in both orders, and no other key has one."""
    problems: list[str] = []
    by_key: dict[bytes, int] = {}
    by_deadline: set[tuple[bytes, int]] = set()
    for k, v in txn.cursor(db=db):
        k = bytes(k)
        if k[:1] == BY_KEY:
            by_key[k[1:]] = int(U64.unpack(v)[0])
        elif k[:1] == BY_DEADLINE and len(k) > 9:
            by_deadline.add((k[9:], int(BE64.unpack_from(k, 1)[0])))
        else:
            problems.append(f"deadline index: unknown entry {k!r}")
    for key in sorted(flagged - set(by_key)):
        problems.append(f"key {key!r} is flagged as expiring but has no deadline")
    for key in sorted(set(by_key) - flagged):
        problems.append(f"key {key!r} has a deadline but its record is not flagged")
    if by_deadline != set(by_key.items()):
        problems.append("deadline index: its two orders disagree")
    return problems
