"""Reading values: decoding a stored record with its CRC checked, inside a read transaction.

A value that fails its CRC is never returned: `decode` counts it
(`mercury_crc_failures_total`) and raises CRCError.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from core.errors import CRCError
from store import chunks, codec, expiry
from store.format import FLAG_CHUNKED, FLAG_EXPIRES, check_chunked_record
from store.layout import K_LAST_SEQ, U64
from store.metrics import CRC_FAILURES
from store.ops import Value


def decode(txn: Any, chunks_db: Any, key: bytes, rec: bytes, expiry_db: Any = None) -> Value:
    """The value of stored record `rec` of `key` (chunks reassembled), CRC checked, with
    its deadline read from `expiry_db` (the ``expiry`` sub-database; None: not read)."""
    try:
        h = codec.decode_record_header(rec)
        if h.flags & FLAG_CHUNKED:
            value = chunks.get(txn, chunks_db, chunks.VALUE_NS, h.seq, h.vlen)
            ok = value is not None and check_chunked_record(key, rec, value)
        else:
            value = codec.record_value(key, rec)
            ok = value is not None
    except ValueError:
        ok, value, h = False, None, None
    if not ok or value is None or h is None:
        CRC_FAILURES.inc()
        raise CRCError(
            f"stored value of key {key.decode('utf-8', 'backslashreplace')!r} fails its CRC; "
            "not served",
            key=key,
            hint="run `mercury verify`; re-bootstrap this node from a healthy one",
        )
    if h.flags & FLAG_EXPIRES and expiry_db is not None:
        return Value(value, h.seq, h.owner, expiry.get(txn, expiry_db, key))
    return Value(value, h.seq, h.owner)


class Reader:
    """Reads inside one short read transaction (see `Store.reader`); the transaction's
    default database is ``data``."""

    def __init__(
        self, txn: Any, chunks_db: Any, meta_db: Any = None, expiry_db: Any = None
    ) -> None:
        self._txn = txn
        self._chunks = chunks_db
        self._meta = meta_db
        self._expiry = expiry_db

    def seq(self) -> int:
        """The last applied seq as this transaction sees it: exactly the state every read
        through this reader returns (a seq read after the transaction may be newer)."""
        if self._meta is None:
            raise RuntimeError("this reader was made without the meta database")
        return int(U64.unpack(self._txn.get(K_LAST_SEQ, db=self._meta))[0])

    def get(self, key: bytes) -> Value | None:
        """The value of `key`, or None. Raises CRCError."""
        rec = self._txn.get(key)
        return None if rec is None else decode(self._txn, self._chunks, key, rec, self._expiry)

    def get_many(self, keys: Iterable[bytes]) -> list[Value | None]:
        """Values of `keys`, in order (None where absent)."""
        return [self.get(k) for k in keys]

    def scan(
        self,
        *,
        start: bytes = b"",
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> Iterator[tuple[bytes, Value | None]]:
        """Keys in order from `start` (inclusive) to `end` (exclusive) and/or under `prefix`;
        values are None when `keys_only`. At most `limit` items."""
        if prefix is not None and start < prefix:
            start = prefix
        cur = self._txn.cursor()
        if not cur.set_range(start):
            return
        for n, (k, v) in enumerate(cur):
            if end is not None and k >= end:
                return
            if prefix is not None and not k.startswith(prefix):
                return
            if limit is not None and n >= limit:
                return
            yield k, None if keys_only else decode(self._txn, self._chunks, k, v, self._expiry)
