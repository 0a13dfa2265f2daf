"""Turning a store into a keyspace-filtered replica's: drop what it does not hold.

A filtered replica bootstraps from a snapshot its source derives for its prefixes from the
whole one it keeps (`filtered_snapshot`: a copy pruned here and compacted, so the transfer
and the replica's disk scale with its keys; resumed and verified like any snapshot), and
prunes what it installed, once, before it streams (a no-op on a derived snapshot but for
the log): every user key outside its prefixes goes (its chunks too, its owner's usage
taken off, as a delete would — but nothing is logged: the root's history is unchanged),
and the log the snapshot carried (whole records, bytes the replica would otherwise keep
for the retention period) is dropped; the replica's log then starts at the snapshot's
seq + 1 with the filtered records it streams. The prefixes are recorded in the node's own
state (`KEYSPACES_STATE`, never logged, not in a snapshot sent on), so a restart prunes
nothing again and a start with other prefixes is refused (`check_keyspaces`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence

from store import filtered, layout
from store.applyloop import forget
from store.batchwrite import ValueChunks
from store.counters import Delta, write_usage
from store.format import decode_record_header
from store.lmdberrors import writing
from store.snapshot import SnapshotInfo, file_sha256, sidecar
from store.store import Store, now_us

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
            rare = ValueChunks(txn, store.dbs.chunks, store.dbs.expiry)
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
                forget(decode_record_header(bytes(cur.value())), len(key), delta, rare, key)
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


def filtered_snapshot(
    src: str, info: SnapshotInfo, out_path: str, prefixes: Sequence[bytes]
) -> SnapshotInfo:
    """Derive from the snapshot file `src` (described by `info`) a snapshot holding only
    the keys under `prefixes`, at the same seq and hash head, with no log (a replica of it
    streams from its seq + 1) and no node-local state; write it to `out_path` with its
    sidecar and return its info. Costs a copy of `src` beside it while it runs."""
    stage = out_path + ".stage"
    tmp = out_path + ".partial"
    shutil.rmtree(stage, ignore_errors=True)
    layout.make_data_dir(stage)
    try:
        shutil.copyfile(src, os.path.join(stage, "data.mdb"))
        with Store.open(stage, sync=False) as store:  # a scratch copy: only `tmp` is synced
            prune(store, prefixes)
            with store.env.begin(write=True) as txn:
                txn.drop(store.dbs.state, delete=False)  # nothing node-local leaves a node
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, layout.FILE_MODE)
            try:
                store.env.copyfd(fd, compact=True)  # live pages only: the pruned ones go
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    digest, size = file_sha256(tmp)
    os.replace(tmp, out_path)
    new = SnapshotInfo(
        info.db_id,
        info.format_version,
        info.seq,
        info.hash_head,
        info.seq + 1,
        digest,
        size,
        now_us(),
    )
    with open(sidecar(out_path), "w") as f:
        f.write(new.to_json())
    return new


def derived_path(src: str, prefixes: Sequence[bytes]) -> str:
    """Where the snapshot derived from `src` for `prefixes` is kept (beside it, so that
    whatever deletes `src` and the files named after it deletes it too)."""
    tag = hashlib.sha256(b"\0".join(sorted(prefixes))).hexdigest()[:16]
    return f"{src}.ks-{tag}"
