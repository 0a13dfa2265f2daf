"""Turning a store into a keyspace-filtered replica's: drop what it does not hold.

A filtered replica bootstraps from its source's whole snapshot (the simplest transfer the
source already knows how to resume and verify), then prunes it here, once, before it
streams: every user key outside its prefixes goes (its chunks too, its owner's usage taken
off, as a delete would — but nothing is logged: the root's history is unchanged), and the
log the snapshot carried (whole records, bytes the replica would otherwise keep for the
retention period) is dropped; the replica's log then starts at the snapshot's seq + 1 with
the filtered records it streams. The prefixes are recorded in the node's own state
(`KEYSPACES_STATE`, never logged, not in a snapshot sent on), so a restart prunes nothing
again and a start with other prefixes is refused (`check_keyspaces`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from store import filtered
from store.applyloop import forget
from store.batchwrite import ValueChunks
from store.counters import Delta, write_usage
from store.format import decode_record_header
from store.lmdberrors import writing
from store.store import Store

#: The node state document holding a filtered store's prefixes (JSON list of strings).
KEYSPACES_STATE = "keyspaces"
#: Keys examined per write transaction: pruning a large snapshot never holds one long txn.
PRUNE_BATCH = 10_000


def held_keyspaces(store: Store) -> tuple[bytes, ...] | None:
    """The prefixes this store was pruned to (None: a full store)."""
    raw = store.get_state(KEYSPACES_STATE)
    if raw is None:
        return None
    return tuple(p.encode() for p in json.loads(raw))


def check_keyspaces(held: Sequence[bytes] | None, wanted: Sequence[bytes] | None) -> str | None:
    """Why a store holding `held` (None: everything) cannot serve as a replica of `wanted`
    (None: everything), or None. A store can narrow (it prunes), never widen."""
    if held is None:
        return None
    if wanted is None:
        return (
            f"this store holds only keys under {filtered.describe(held)}: start it with the "
            "same --keyspace prefixes, or move DATA_DIR aside and bootstrap a full replica"
        )
    wider = [w for w in wanted if not w.startswith(tuple(held))]
    if wider:
        return (
            f"this store holds only keys under {filtered.describe(held)}, not "
            f"{filtered.describe(wider)}: move DATA_DIR aside to bootstrap the wider keyspaces"
        )
    return None


def prune(store: Store, prefixes: Sequence[bytes], *, batch: int = PRUNE_BATCH) -> int:
    """Delete every user key outside `prefixes` and the log before the head, then record
    the prefixes (module doc); return the keys deleted. Idempotent: a prune cut by a crash
    is finished by the next start."""
    keep = tuple(prefixes)
    removed = 0
    start = b""
    counted = store.format_version >= 2
    while True:
        delta: Delta = {}
        with (
            writing(store.path, "pruning keys outside the replica's keyspaces"),
            store.env.begin(write=True, db=store.dbs.data) as txn,
        ):
            cur = txn.cursor()
            rare = ValueChunks(txn, store.dbs.chunks)
            more = cur.set_range(start)
            n = 0
            while more and n < batch:
                n += 1
                key = bytes(cur.key())
                held = next((p for p in keep if key.startswith(p)), None)
                if held is not None:
                    nxt = filtered.past(held)
                    more = nxt is not None and cur.set_range(nxt)
                    continue
                forget(decode_record_header(bytes(cur.value())), len(key), delta, rare)
                cur.delete()  # moves to the next key; past the last one, to none (b"")
                more = bool(cur.key())
                removed += 1
            start = bytes(cur.key()) if more else b""
            if counted:
                write_usage(txn, store.dbs.meta, delta)
        if not more:
            break
    while store.gc_log(keep_entries=0, max_records=1000):
        pass
    store.put_state(KEYSPACES_STATE, json.dumps([p.decode() for p in keep]).encode())
    return removed
