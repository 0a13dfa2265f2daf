"""The per-op loop of `Store.apply`, pure-Python reference (Cython twin in `_codec.pyx`).

`apply_ops` walks a batch inside an open LMDB write transaction and decides, op by op:
validation, the condition (`expect_seq`), duplicate detection, the new record and the usage
deltas. It is given the transaction's bound ``get``/``put``/``delete`` acting on the data
sub-database (the transaction's default database) and a `Rare` object for the uncommon paths
(chunked values), so it never imports lmdb itself.

Contract: ops are processed in order and later ops see earlier ones. On an invalid op it
raises InvalidOpError (the caller's transaction then aborts, so nothing is applied).
Returns ``(results, entries, last_seq, delta)`` where `entries` are ``(op, owner, key, value)``
for `pack_entries` and `delta` maps owner -> [keys, bytes, writes, deletes, duplicates,
throttled] increments.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from core.errors import InvalidOpError
from store import format as fmt
from store.ops import Op, Result, Status
from store.usage import stored_bytes


class Rare(Protocol):
    """Callbacks for the uncommon paths: chunked values (over one page) and deadlines
    (`store/expiry.py`; only keys whose record carries `FLAG_EXPIRES` have one)."""

    def chunked_equal(self, seq: int, vlen: int, value: bytes) -> bool:
        """Whether the chunked value stored under `seq` equals `value`."""

    def put_chunks(self, seq: int, value: bytes | memoryview) -> None:
        """Store `value` as chunks under `seq` (a replica hands a view into its record)."""

    def drop_chunks(self, seq: int, vlen: int) -> None:
        """Delete the chunks of the value stored under `seq`."""

    def deadline(self, key: bytes) -> int:
        """The deadline of `key` (µs), 0 when none."""

    def set_deadline(self, key: bytes, deadline_us: int) -> None:
        """Index `key` under `deadline_us` (any earlier deadline already cleared)."""

    def clear_deadline(self, key: bytes) -> None:
        """Remove the deadline of `key`."""


#: Fresh records (keys past the data's last one) go to `append` in runs of at most this
#: many: one LMDB loop in C per run instead of one Python call per op, and the records of
#: a run of big values are not all held at once.
APPEND_RUN = 1024


def validate(op: Op) -> None:
    """Raise InvalidOpError for an op the store refuses."""
    if not 1 <= len(op.key) <= fmt.MAX_KEY:
        raise InvalidOpError(f"key must be 1 to {fmt.MAX_KEY} bytes, got {len(op.key)}")
    if op.op != fmt.OP_SET and op.op != fmt.OP_DELETE and op.op != fmt.OP_EXPIRE:
        raise InvalidOpError(f"unknown op {op.op}")
    if op.deadline < 0 or op.deadline >= 1 << 64:
        raise InvalidOpError(f"deadline {op.deadline} out of range")
    if len(op.value) > fmt.MAX_VALUE:
        raise InvalidOpError(f"value of {len(op.value)} bytes exceeds {fmt.MAX_VALUE}")
    if len(op.owner.encode()) > fmt.MAX_OWNER:
        raise InvalidOpError(f"owner name longer than {fmt.MAX_OWNER} bytes")


def apply_ops(
    ops: Sequence[Op],
    get: Callable[..., Any],
    put: Callable[..., Any],
    delete: Callable[..., Any],
    last_seq: int,
    rare: Rare,
    max_key: bytes | None = None,
    append: Callable[..., Any] | None = None,
) -> tuple[list[Result], list[tuple[int, bytes, bytes, bytes]], int, dict[str, list[int]]]:
    """Process `ops` in order inside the caller's write transaction (see module doc).

    `max_key` is the largest key in the data sub-database (None when empty or unknown):
    a set of a greater key cannot overwrite anything, so it skips the lookup and is stored
    with `append` — called with a list of ``(key, record)`` in ascending key order, every
    key past the data's last (LMDB's append mode: `Cursor.putmulti(items, append=True)`),
    at most `APPEND_RUN` at a time, and always before the loop reads or writes the data
    again (`get`, `put`, `delete`), so no lookup misses a record still waiting — so a bulk
    load in key order runs at append speed.
    """
    results: list[Result] = []
    entries: list[tuple[int, bytes, bytes, bytes]] = []
    delta: dict[str, list[int]] = {}
    seq = last_seq
    run: list[tuple[bytes, bytes]] = []  # fresh records not appended yet
    for op in ops:
        validate(op)
        key = op.key
        fresh = append is not None and (max_key is None or key > max_key)
        if run and not fresh and append is not None:
            append(run)
            run = []
        old = None if fresh else get(key)
        h = fmt.decode_record_header(old) if old is not None else None
        cur = h.seq if h is not None else 0
        if op.expect_seq is not None and op.expect_seq != cur:
            results.append(Result(Status.PRECONDITION_FAILED, cur))
            continue
        d = delta.get(op.owner)
        if d is None:
            d = delta[op.owner] = [0, 0, 0, 0, 0, 0]
        owner = op.owner.encode()
        if op.op == fmt.OP_SET:
            value = op.value
            dl = op.deadline
            if old is not None and h is not None and h.vlen == len(value):
                if h.flags & fmt.FLAG_CHUNKED:
                    dup = rare.chunked_equal(h.seq, h.vlen, value)
                else:
                    dup = old[h.value_offset :] == value
                # Same bytes but another deadline (or none where there was one) is a write.
                if dup and (h.flags & fmt.FLAG_EXPIRES or dl):
                    dup = bool(h.flags & fmt.FLAG_EXPIRES) and rare.deadline(key) == dl
                if dup:
                    d[4] += 1
                    results.append(Result(Status.DUPLICATE, h.seq))
                    continue
            seq += 1
            big = len(value) > fmt.CHUNK_SIZE
            if big:
                rare.put_chunks(seq, value)
            rec = fmt.encode_record(key, seq, owner, value, big, dl != 0)
            if fresh and append is not None:
                run.append((key, rec))
                if len(run) >= APPEND_RUN:
                    append(run)
                    run = []
                max_key = key
            else:
                put(key, rec)
            if h is not None:
                forget(h, len(key), delta, rare, key)
            if dl:
                rare.set_deadline(key, dl)
            d[0] += 1
            d[1] += stored_bytes(len(key), len(value), len(owner))
            d[2] += 1
            if dl:
                entries.append((fmt.OP_SET_EXPIRING, owner, key, fmt.expiring_value(dl, value)))
            else:
                entries.append((fmt.OP_SET, owner, key, value))
            results.append(Result(Status.WRITTEN, seq))
        else:
            expiring = op.op == fmt.OP_EXPIRE
            if h is None or (expiring and not h.flags & fmt.FLAG_EXPIRES):
                results.append(Result(Status.ABSENT, cur))
                continue
            seq += 1
            delete(key)
            forget(h, len(key), delta, rare, key)
            if expiring:  # not a producer's delete: its owner's usage counts an expiry
                count_expiry(d)
                entries.append((fmt.OP_EXPIRE, owner, key, b""))
                results.append(Result(Status.EXPIRED, seq))
            else:
                d[3] += 1
                entries.append((fmt.OP_DELETE, owner, key, b""))
                results.append(Result(Status.DELETED, seq))
    if run and append is not None:
        append(run)
    return results, entries, seq, delta


def count_expiry(d: list[int]) -> None:
    """Count one expiry in an owner's usage delta: the seventh counter, added to the list
    only when there is one (`store/usage.py`). Shared with the replica's apply."""
    if len(d) < 7:
        d.append(0)
    d[6] += 1


def forget(
    h: fmt.RecordHeader, key_len: int, delta: dict[str, list[int]], rare: Rare, key: bytes
) -> None:
    """Account for an old record going away (overwritten or deleted): drop its chunks and
    its deadline, and take its key and bytes off its owner's usage delta. Shared with the
    replica's apply."""
    if h.flags & fmt.FLAG_CHUNKED:
        rare.drop_chunks(h.seq, h.vlen)
    if h.flags & fmt.FLAG_EXPIRES:
        rare.clear_deadline(key)
    d = delta.get(h.owner)
    if d is None:
        d = delta[h.owner] = [0, 0, 0, 0, 0, 0]
    d[0] -= 1
    d[1] -= stored_bytes(key_len, h.vlen, h.owner_len)
