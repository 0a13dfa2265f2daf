"""Format 5 → 6: a store names the hash of its log chain.

Up to format 5 every log chained with BLAKE2b-256. From format 6 the hash is chosen when a
lineage begins (`store/chainhash.py`: SHA-256 for new stores) and recorded in ``meta``;
code reads it from there. This step records the one hash an older store can hold,
``blake2b-256``: no log entry, hash head or value changes, so a migrated root and its
replicas (migrated or not yet) still hold identical logs, and they may be migrated in any
order. Only a store created at format 6 can chain with SHA-256, and a format-5 node
refuses its snapshots (newer format), so no older node ever meets that chain.
"""

from __future__ import annotations

from migrations.plan import Step
from store import chainhash
from store.layout import K_CHAIN_HASH
from store.migration import MigrationTxn, Progress


def _apply(mtx: MigrationTxn, progress: Progress) -> None:
    if mtx.get_meta(K_CHAIN_HASH) is None:
        mtx.put_meta(K_CHAIN_HASH, chainhash.LEGACY.encode("ascii"))


STEP = Step(
    from_version=5,
    name="0006_chain_hash",
    description="record the log chain's hash in meta (blake2b-256, the one older stores use)",
    apply=_apply,
)
