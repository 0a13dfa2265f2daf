"""Replicated documents: named JSON-or-bytes documents every node holds, changed only
through the log.

The root writes a document as a log entry with op 3 (`store/format.py`): key = the
document's name, value = its bytes (empty = remove it), no owner. The entry rides in a
batch's log record (`Store.apply(..., docs=...)`) or in a record of its own
(`Store.put_docs`), so it commits in the same transaction as that batch and reaches every
replica by the ordinary replication stream; a replica's apply (`store/replica_apply.py`)
and a snapshot carry it like the data. Each node keeps the current version in the ``docs``
sub-database as ``seq (u64) ++ bytes``: the seq of the entry that wrote it is its version,
the same on every node.

Well-known documents: ``acl`` (producers, consumers, token hashes, quotas), ``audit/...``,
``admin_token_hash`` (format >= 5) and the root's usage series. Idempotency answers ride in
op-3 entries too, under keys starting with NUL that no document name can have; they land in
``idem``, not here (`store/nodedocs.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidOpError
from store import chainhash, codec, layout, nodedocs, txlog
from store.format import MAX_KEY, MAX_VALUE, OP_DOC
from store.layout import K_HASH_HEAD, K_LAST_SEQ, K_LOG_FIRST, U64

#: The document holding the admin token's hash (hex SHA-256), written by `mercury init`
#: (format >= 5; before, it was node-local).
ADMIN_HASH = "admin_token_hash"

#: What a document change is: new bytes, or None to remove the document.
DocChanges = Mapping[str, bytes | None]


@dataclass(frozen=True, slots=True)
class Doc:
    """A replicated document: its bytes and the seq of the log entry that wrote it."""

    seq: int
    body: bytes


def entries(changes: DocChanges) -> list[tuple[int, bytes, bytes, bytes]]:
    """The log entries ``(op, owner, key, value)`` of `changes`, in name order.

    Raises InvalidOpError (before anything is written) for a name that is not 1 to
    MAX_KEY bytes of UTF-8 without NUL, an empty body (empty means "remove") or a body over
    MAX_VALUE.
    """
    out = []
    for name in sorted(changes):
        body = changes[name]
        key = name.encode()
        if not 1 <= len(key) <= MAX_KEY or "\x00" in name:
            raise InvalidOpError(f"document name must be 1 to {MAX_KEY} bytes without NUL")
        if body is not None and not 0 < len(body) <= MAX_VALUE:
            raise InvalidOpError(f"document {name!r} must be 1 to {MAX_VALUE} bytes")
        out.append((OP_DOC, b"", key, body or b""))
    return out


def apply_entry(txn: Any, dbs: layout.Dbs, seq: int, key: bytes, value: bytes) -> None:
    """Apply one op-3 entry inside `txn` (the root's batch or a replica's apply): a
    document, or an idempotency answer when its key starts with NUL."""
    if nodedocs.is_answer(key):
        nodedocs.apply_answer(txn, dbs, key, value)
    elif value:
        txn.put(key, U64.pack(seq) + value, db=dbs.docs)
    else:
        txn.delete(key, db=dbs.docs)


def write_logged(
    txn: Any, dbs: layout.Dbs, changes: DocChanges, time_us: int
) -> tuple[int, int, bytes]:
    """Write `changes` as one log record of their own inside `txn`; return (first seq,
    last seq, hash head). Nothing is written when `changes` is empty."""
    ents = entries(changes)
    last = int(U64.unpack(txn.get(K_LAST_SEQ, db=dbs.meta))[0])
    head = bytes(txn.get(K_HASH_HEAD, db=dbs.meta))
    if not ents:
        return last + 1, last, head
    payload, head = codec.pack_entries(last + 1, ents, head, chainhash.read(txn, dbs.meta))
    txlog.put_batch(txn, dbs, last + 1, len(ents), time_us, head, payload)
    for i, (_op, _owner, key, value) in enumerate(ents):
        apply_entry(txn, dbs, last + 1 + i, key, value)
    last += len(ents)
    txn.put(K_LAST_SEQ, U64.pack(last), db=dbs.meta)
    txn.put(K_HASH_HEAD, head, db=dbs.meta)
    return last + 1 - len(ents), last, head


def _decode(raw: Any) -> Doc:
    b = bytes(raw)
    return Doc(int(U64.unpack(b[:8])[0]), b[8:])


def get(env: Any, dbs: layout.Dbs, name: str) -> Doc | None:
    """Document `name` of this node, or None."""
    if dbs.docs is None:
        return None
    with env.begin(db=dbs.docs) as txn:
        raw = txn.get(name.encode())
        return None if raw is None else _decode(raw)


def scan(
    env: Any, dbs: layout.Dbs, prefix: str, *, after: str = "", limit: int = 1000
) -> list[tuple[str, Doc]]:
    """Documents whose names start with `prefix` and sort after `after`, in name order,
    at most `limit` of them (one short read transaction)."""
    if dbs.docs is None:
        return []
    out: list[tuple[str, Doc]] = []
    p = prefix.encode()
    start = max(p, after.encode() + b"\x00") if after else p
    with env.begin(db=dbs.docs) as txn:
        cur = txn.cursor()
        if not cur.set_range(start):
            return out
        for k, v in cur:
            if not bytes(k).startswith(p) or len(out) >= limit:
                break
            out.append((bytes(k).decode(), _decode(v)))
    return out


def check(txn: Any, dbs: layout.Dbs, logged: Mapping[bytes, tuple[int, bytes]]) -> list[str]:
    """Problems of the ``docs`` sub-database against the retained log (for `store.check`).

    `logged` is the latest op-3 entry per key in the retained log, (seq, value); those
    carrying idempotency answers are not documents and are skipped (answers expire on each
    node on their own). A document must hold exactly what its latest retained entry wrote
    (or be absent when that entry removed it); one written before the retained log must
    have a seq below its first seq and at most the last seq.
    """
    if dbs.docs is None:
        return []
    out: list[str] = []
    first = int(U64.unpack(txn.get(K_LOG_FIRST, db=dbs.meta))[0])
    last = int(U64.unpack(txn.get(K_LAST_SEQ, db=dbs.meta))[0])
    seen: set[bytes] = set()
    for k, v in txn.cursor(db=dbs.docs):
        key, doc = bytes(k), _decode(v)
        seen.add(key)
        want = logged.get(key)
        if want is None:
            if not doc.seq < first:
                out.append(f"document {key!r} at seq {doc.seq} has no entry in the retained log")
        elif not want[1]:
            out.append(f"document {key!r} was removed at seq {want[0]} but is still stored")
        elif (doc.seq, doc.body) != want:
            out.append(f"document {key!r} differs from its log entry at seq {want[0]}")
        if doc.seq > last:
            out.append(f"document {key!r} has seq {doc.seq}, past the last seq {last}")
    for key, (seq, value) in logged.items():
        if value and key not in seen and not nodedocs.is_answer(key):
            out.append(f"document {key!r} written at seq {seq} is missing")
    return out
