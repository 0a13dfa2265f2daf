"""Idempotency answers (replicated through the log) and node-local named state.

An idempotency answer is stored in ``idem`` as the u64 time it was stored (µs) followed by
the answer bytes. The root's batch writer puts each answer in the batch's own log record as
an op-3 entry whose key is NUL ++ the idempotency key (`answer_entry`; a document name can
hold no NUL, so the two never meet) and whose value is exactly the stored bytes, so every
node that applies the record (`apply_answer`) stores the same bytes and a promoted replica
answers a retry as its root would have. Expiry is node-local: `gc_idempotency` forgets
answers stored before a cut-off on each node, without logging anything.

``state`` holds named documents of this node alone, never logged and dropped from a
snapshot sent to another node. Since format 5 nothing of Mercury's own lives there (the
ACL and the admin token's hash are replicated documents, `store/docs.py`).
"""

from __future__ import annotations

from typing import Any

from store import layout
from store.format import OP_DOC
from store.layout import U64

#: First byte of the log entry key of an idempotency answer (never of a document name).
ANSWER_PREFIX = b"\x00"


def get_state(env: Any, dbs: layout.Dbs, name: str) -> bytes | None:
    """A named document of this node, or None."""
    with env.begin(db=dbs.state) as txn:
        raw = txn.get(name.encode())
        return None if raw is None else bytes(raw)


def put_state(env: Any, dbs: layout.Dbs, name: str, value: bytes) -> None:
    """Store a named document of this node in its own transaction."""
    with env.begin(write=True, db=dbs.state) as txn:
        txn.put(name.encode(), value)


def answer_entry(key: bytes, stored_us: int, answer: bytes) -> tuple[int, bytes, bytes, bytes]:
    """The log entry ``(op, owner, key, value)`` carrying answer `answer` of idempotency
    key `key`, stored at `stored_us`: its value is the ``idem`` record itself."""
    return OP_DOC, b"", ANSWER_PREFIX + key, U64.pack(stored_us) + answer


def is_answer(entry_key: bytes) -> bool:
    """Whether an op-3 entry key carries an idempotency answer (not a document)."""
    return entry_key[:1] == ANSWER_PREFIX


def apply_answer(txn: Any, dbs: layout.Dbs, entry_key: bytes, value: bytes) -> None:
    """Store the answer of an `answer_entry` inside `txn` (an empty value removes it)."""
    if value:
        txn.put(entry_key[1:], value, db=dbs.idem)
    else:
        txn.delete(entry_key[1:], db=dbs.idem)


def get_idempotent(env: Any, dbs: layout.Dbs, key: bytes) -> tuple[int, bytes] | None:
    """(time stored in µs, answer) of an idempotency key, or None."""
    with env.begin(db=dbs.idem) as txn:
        raw = txn.get(key)
        if raw is None:
            return None
        return U64.unpack(raw[:8])[0], bytes(raw[8:])


def gc_idempotency(env: Any, dbs: layout.Dbs, older_than_us: int, max_keys: int) -> int:
    """Forget idempotency keys stored before `older_than_us`; return how many."""
    n = 0
    with env.begin(write=True, db=dbs.idem) as txn:
        cur = txn.cursor()
        ok = cur.first()
        while ok and n < max_keys:
            if U64.unpack(cur.value()[:8])[0] < older_than_us:
                # delete() moves to the next record; past the last one the cursor is
                # unpositioned (an empty key, which LMDB never stores)
                ok = cur.delete() and bool(cur.key())
                n += 1
            else:
                ok = cur.next()
    return n
