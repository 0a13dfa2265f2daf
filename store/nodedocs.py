"""Node-local documents: named state (ACL, admin token hash) and idempotency answers.

Neither is replicated (a snapshot installed on a replica drops both). An idempotency record
is the u64 time it was stored (µs) followed by the answer bytes; the batch writer stores
them in the batch's own transaction, `gc_idempotency` forgets old ones.
"""

from __future__ import annotations

from typing import Any

from store import layout
from store.layout import U64


def get_state(env: Any, dbs: layout.Dbs, name: str) -> bytes | None:
    """A named document of this node, or None."""
    with env.begin(db=dbs.state) as txn:
        raw = txn.get(name.encode())
        return None if raw is None else bytes(raw)


def put_state(env: Any, dbs: layout.Dbs, name: str, value: bytes) -> None:
    """Store a named document of this node in its own transaction."""
    with env.begin(write=True, db=dbs.state) as txn:
        txn.put(name.encode(), value)


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
                ok = cur.delete()
                n += 1
            else:
                ok = cur.next()
    return n
