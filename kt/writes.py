"""Kyoto Tycoon writes on the root's KT listener, as one producer (`--kt-producer NAME`).

The listener never imports the gateway: it calls a `KtWriter` (the protocol below) that
the composition root (`mercury/root.py`) builds over the gateway's write path, so a KT
write goes through the same ACL, guards, quotas, batching and durable commit as an HTTP
write, and is answered only after that commit.

KT's semantics on top of Mercury's ops: `add` is a set conditional on absence, `replace`,
`cas`, `increment`, `increment_double` and `append` read the current value and write
conditionally on its seq (retried a few times when another writer got in between); a
failed condition is KT's 450 with KT's own error text. `clear` deletes every key of the
producer's keyspaces in one write (so the producer's mass-delete guard applies); `seize`
reads the value and deletes it conditionally on its seq. Mercury values never expire:
`xt` is accepted and ignored.
"""

from __future__ import annotations

import math
import struct
from typing import Protocol

from core import ttl
from core.errors import MercuryError
from core.problems import classify
from store.ops import DELETE, SET, Op, Result, Status
from store.store import Store

#: KT's error texts (``DB: code: name: message``) for the failures a client tests for.
DUPLICATE = b"DB: 6: record duplication: record duplication"
NO_RECORD = b"DB: 7: no record: no record"
CONFLICT = b"DB: 8: logical inconsistency: status conflict"
NOT_NUMBER = b"DB: 8: logical inconsistency: the existing record is not a number"
#: Read-modify-write attempts before a busy key is answered 503 (KT's timeout status).
RMW_ATTEMPTS = 8
#: Keys `clear` deletes in one write at most (beyond it: refused, nothing deleted).
MAX_CLEAR = 10_000

_I64 = struct.Struct(">q")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
#: Kyoto Cabinet's `increment_double` record: integral part, then the fraction in 10^-15.
_DBL = struct.Struct(">qq")
DECUNIT = 10**15


class KtWriter(Protocol):
    """The write path the KT listener calls (wired by `mercury/root.py`)."""

    @property
    def producer(self) -> str:
        """The producer KT writes are made as."""
        ...

    def keyspaces(self) -> tuple[bytes, ...]:
        """The producer's keyspace prefixes now (what `clear` may delete)."""
        ...

    async def write(self, ops: list[Op], nbytes: int) -> list[Result]:
        """Apply `ops` as one request of the producer; results after the durable commit.
        Raises a `MercuryError` when refused (ACL, guard, quota, size...)."""
        ...


class KtWriteFailed(Exception):
    """A write answered with a KT status other than 200 (`status`, `message`)."""

    def __init__(self, status: int, message: bytes) -> None:
        super().__init__(message.decode("latin-1"))
        self.status = status
        self.message = message


def kt_status(err: MercuryError) -> tuple[int, bytes]:
    """KT status and error text of a refused write: a refusal that can succeed later
    (rate quota, shutting down) is 503, KT's retryable timeout; a client fault that never
    will (ACL, guard, size) is 400 "invalid parameters"; anything else 500."""
    status = classify(err).status
    text = str(err).encode()
    if status in (429, 503):
        return 503, b"timeout: " + text
    if 400 <= status < 500:
        return 400, b"invalid parameters: " + text
    return 500, b"DB: 1: implementation error: " + text


def _one(results: list[Result]) -> Result:
    return results[0]


class KtWrites:
    """The write procedures over `store` (reads of the current value) and `writer`."""

    def __init__(self, store: Store, writer: KtWriter) -> None:
        self.store = store
        self.writer = writer
        self.cnt_set = 0
        self.cnt_set_misses = 0
        self.cnt_remove = 0
        self.cnt_remove_misses = 0

    async def _write(self, ops: list[Op]) -> list[Result]:
        nbytes = sum(len(op.key) + len(op.value) for op in ops)
        try:
            return await self.writer.write(ops, nbytes)
        except MercuryError as err:
            raise KtWriteFailed(*kt_status(err)) from err

    # --- single keys -------------------------------------------------------------------

    async def set(self, key: bytes, value: bytes, mode: str = "set", deadline: int = 0) -> None:
        """set / add / replace (KtWriteFailed 450 when add finds the key or replace
        does not); `deadline` from KT's `xt` (`core/ttl.py`; an expiry already past makes a
        set a removal, as KT would expire the record at once)."""
        self.cnt_set += 1
        if deadline == ttl.EXPIRED_NOW:
            if mode != "set":
                raise KtWriteFailed(400, b"invalid parameters: xt already past")
            await self._write([Op(DELETE, key)])
            return
        if mode == "add":
            r = _one(await self._write([Op(SET, key, value, expect_seq=0, deadline=deadline)]))
            if r.status is Status.PRECONDITION_FAILED:
                self.cnt_set_misses += 1
                raise KtWriteFailed(450, DUPLICATE)
            return
        if mode == "replace":
            for _ in range(RMW_ATTEMPTS):
                cur = self.store.get(key)
                if cur is None:
                    self.cnt_set_misses += 1
                    raise KtWriteFailed(450, NO_RECORD)
                op = Op(SET, key, value, expect_seq=cur.seq, deadline=deadline)
                r = _one(await self._write([op]))
                if r.status is not Status.PRECONDITION_FAILED:
                    return
            raise KtWriteFailed(503, b"timeout: the key kept changing")
        await self._write([Op(SET, key, value, deadline=deadline)])

    async def remove(self, key: bytes) -> None:
        """remove (KtWriteFailed 450 when absent)."""
        self.cnt_remove += 1
        r = _one(await self._write([Op(DELETE, key)]))
        if r.status is Status.ABSENT:
            self.cnt_remove_misses += 1
            raise KtWriteFailed(450, NO_RECORD)

    async def seize(self, key: bytes) -> bytes:
        """Remove the key and return the value it had (KtWriteFailed 450 when absent)."""
        self.cnt_remove += 1
        for _ in range(RMW_ATTEMPTS):
            cur = self.store.get(key)
            if cur is None:
                self.cnt_remove_misses += 1
                raise KtWriteFailed(450, NO_RECORD)
            r = _one(await self._write([Op(DELETE, key, expect_seq=cur.seq)]))
            if r.status is not Status.PRECONDITION_FAILED:
                return cur.value
        raise KtWriteFailed(503, b"timeout: the key kept changing")

    async def cas(self, key: bytes, oval: bytes | None, nval: bytes | None) -> None:
        """KT's cas: `oval` None = the key must be absent; `nval` None = remove it."""
        self.cnt_set += 1
        cur = self.store.get(key)
        if (cur is None) != (oval is None) or (cur is not None and cur.value != oval):
            self.cnt_set_misses += 1
            raise KtWriteFailed(450, CONFLICT)
        seq = 0 if cur is None else cur.seq
        if nval is None:
            if cur is None:
                return  # absent and asked to stay absent: KT succeeds with nothing to do
            op = Op(DELETE, key, expect_seq=seq)
        else:
            op = Op(SET, key, nval, expect_seq=seq)
        r = _one(await self._write([op]))
        if r.status is Status.PRECONDITION_FAILED:
            self.cnt_set_misses += 1
            raise KtWriteFailed(450, CONFLICT)

    async def increment(self, key: bytes, num: int, orig: str | None) -> int:
        """KT's increment on an 8-byte big-endian integer value; returns the new number.
        `orig`: the initial value when absent ("try": fail instead; "set": the number
        becomes `num` whether present or not). A value that is not 8 bytes is KT's 450."""
        self.cnt_set += 1
        for _ in range(RMW_ATTEMPTS):
            cur = self.store.get(key)
            if cur is not None and len(cur.value) != 8:
                self.cnt_set_misses += 1
                raise KtWriteFailed(450, NOT_NUMBER)
            if cur is None:
                if orig == "try":
                    self.cnt_set_misses += 1
                    raise KtWriteFailed(450, NO_RECORD)
                new = num + (0 if orig in (None, "set") else int(orig or 0))
            else:
                # as Kyoto Cabinet: orig "set" replaces the number, otherwise num is added
                new = num if orig == "set" else _I64.unpack(cur.value)[0] + num
            if not -(1 << 63) <= new < (1 << 63):
                raise KtWriteFailed(450, b"DB: 8: logical inconsistency: overflow")
            seq = 0 if cur is None else cur.seq
            r = _one(await self._write([Op(SET, key, _I64.pack(new), expect_seq=seq)]))
            if r.status is not Status.PRECONDITION_FAILED:
                return new
        raise KtWriteFailed(503, b"timeout: the key kept changing")

    async def increment_double(self, key: bytes, num: float, orig: str | None) -> float:
        """KT's increment_double on Kyoto Cabinet's 16-byte decimal (`double_value`);
        returns the new number. `orig` as for `increment`."""
        self.cnt_set += 1
        if not math.isfinite(num):
            raise KtWriteFailed(400, b"invalid parameters: num must be finite")
        for _ in range(RMW_ATTEMPTS):
            cur = self.store.get(key)
            if cur is None:
                if orig == "try":
                    self.cnt_set_misses += 1
                    raise KtWriteFailed(450, NO_RECORD)
                start = (0, 0) if orig in (None, "set") else double_parts(float(orig or 0))
                new = add_double(start, num)
            else:
                parts = double_value(cur.value)
                if parts is None:
                    self.cnt_set_misses += 1
                    raise KtWriteFailed(450, NOT_NUMBER)
                new = double_parts(num) if orig == "set" else add_double(parts, num)
            seq = 0 if cur is None else cur.seq
            r = _one(await self._write([Op(SET, key, _DBL.pack(*new), expect_seq=seq)]))
            if r.status is not Status.PRECONDITION_FAILED:
                return new[0] + new[1] / DECUNIT
        raise KtWriteFailed(503, b"timeout: the key kept changing")

    async def append(self, key: bytes, value: bytes) -> None:
        """Append to the value (set when absent)."""
        self.cnt_set += 1
        for _ in range(RMW_ATTEMPTS):
            cur = self.store.get(key)
            seq = 0 if cur is None else cur.seq
            new = value if cur is None else cur.value + value
            r = _one(await self._write([Op(SET, key, new, expect_seq=seq)]))
            if r.status is not Status.PRECONDITION_FAILED:
                return
        raise KtWriteFailed(503, b"timeout: the key kept changing")

    # --- bulk ----------------------------------------------------------------------------

    async def set_bulk(self, items: list[tuple[bytes, bytes]], deadline: int = 0) -> int:
        """Set every (key, value) in one write (each with `deadline`); the number stored."""
        if not items:
            return 0
        if deadline == ttl.EXPIRED_NOW:
            raise KtWriteFailed(400, b"invalid parameters: xt already past")
        self.cnt_set += len(items)
        await self._write([Op(SET, k, v, deadline=deadline) for k, v in items])
        return len(items)

    async def set_records(self, records: list[tuple[bytes, bytes, int]]) -> int:
        """A binary set_bulk: every (key, value, deadline) in one write, each with its own
        deadline; a record whose expiry is already past removes its key (KT would expire it
        at once). The number of records done."""
        if not records:
            return 0
        self.cnt_set += len(records)
        await self._write(
            [
                Op(DELETE, k) if d == ttl.EXPIRED_NOW else Op(SET, k, v, deadline=d)
                for k, v, d in records
            ]
        )
        return len(records)

    async def remove_bulk(self, keys: list[bytes]) -> int:
        """Remove every key in one write; the number that existed."""
        if not keys:
            return 0
        self.cnt_remove += len(keys)
        results = await self._write([Op(DELETE, k) for k in keys])
        removed = sum(1 for r in results if r.status is Status.DELETED)
        self.cnt_remove_misses += len(keys) - removed
        return removed

    async def clear(self) -> int:
        """Delete every key of the producer's keyspaces in one write; how many."""
        keys = keys_to_clear(self.store, self.writer)
        if keys is None:
            raise KtWriteFailed(
                400,
                b"invalid parameters: clear deletes at most %d keys at once; "
                b"remove them in bulk instead" % MAX_CLEAR,
            )
        return await self.remove_bulk(keys)


def double_parts(x: float) -> tuple[int, int]:
    """A finite number as Kyoto Cabinet's (integral, fraction × 10^15) pair, both with the
    number's sign."""
    frac, whole = math.modf(x)
    return int(whole), round(frac * DECUNIT)


def double_value(raw: bytes) -> tuple[int, int] | None:
    """The (integral, fraction) pair of a stored decimal: Kyoto Cabinet's 16-byte record
    (two big-endian int64); None when the value is not one (or is KC's NaN/infinity)."""
    if len(raw) != _DBL.size:
        return None
    integ, fract = _DBL.unpack(raw)
    if integ in (_I64_MIN, _I64_MAX):
        return None
    return integ, fract


def add_double(parts: tuple[int, int], num: float) -> tuple[int, int]:
    """`parts` + `num` as Kyoto Cabinet adds them: integral and fraction parts separately,
    a fraction beyond ±10^15 carried into the integral part."""
    add_i, add_f = double_parts(num)
    integ, fract = parts[0] + add_i, parts[1] + add_f
    if fract >= DECUNIT:
        integ, fract = integ + 1, fract - DECUNIT
    elif fract <= -DECUNIT:
        integ, fract = integ - 1, fract + DECUNIT
    if not _I64_MIN < integ < _I64_MAX:
        raise KtWriteFailed(450, b"DB: 8: logical inconsistency: overflow")
    return integ, fract


def keys_to_clear(store: Store, writer: KtWriter) -> list[bytes] | None:
    """Every key of the writer's producer's keyspaces, or None when there are more than
    MAX_CLEAR (KT's `clear`, memcached's `flush_all`: one write, all or nothing)."""
    keys: list[bytes] = []
    with store.reader() as r:
        for prefix in writer.keyspaces():
            left = MAX_CLEAR + 1 - len(keys)
            if left > 0:
                keys += [k for k, _ in r.scan(prefix=prefix, limit=left, keys_only=True)]
    return None if len(keys) > MAX_CLEAR else keys
