"""Promotion: a replica's store continues its history as a root's.

Since format 5 a replica holds everything a root needs (`store/docs.py`: the ACL with every
producer, consumer, quota and token hash, the admin token's hash; `store/nodedocs.py`: the
idempotency answers), and nothing in a store says which role wrote it: a root is simply the
one process that applies batches (`Store.apply`) instead of a source's records. So
promoting changes no data. It writes one log record, the replicated document
``promotion``, which says after which seq and hash head the history went on under a new
root, so every node that follows the promoted root (and an operator reading its log) can
tell; the seq and the hash chain continue unbroken, so replicas of the old root that switch
to the new one see no gap.

The caller must be the store's only writer (hold `store.lock.WriterLock`) and must have
stopped applying a source's records first; `mercury promote` does both for a stopped replica,
an in-process leader candidate calls `promote` on its open store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from core.errors import StoreError
from store.batchwrite import now_us
from store.docs import ADMIN_HASH
from store.filtered import describe
from store.prune import held_keyspaces
from store.store import Store

#: The replicated document recording the last promotion.
PROMOTION_DOC = "promotion"
#: The replicated document holding the ACL (`gateway/aclstore.py`).
ACL_DOC = "acl"


@dataclass(frozen=True)
class Promotion:
    """What `promote` recorded: the position the new root continued from, and the seq of
    the ``promotion`` entry it wrote."""

    after_seq: int
    after_hash: str
    time_us: int
    seq: int
    #: False when the store holds no admin token hash (no admin call can succeed).
    has_admin: bool
    #: False when the store holds no ACL (no producer can write).
    has_acl: bool

    def to_json(self) -> str:
        """One JSON object (what `mercury promote` prints)."""
        return json.dumps(self.__dict__, sort_keys=True)


def promote(
    store: Store, *, time_us: int | None = None, extra: Mapping[str, object] | None = None
) -> Promotion:
    """Record in `store`'s log that it now continues its history as a root's; return what
    was recorded.

    `extra` adds fields to the ``promotion`` document (e.g. an election term); they must
    not override ``promoted_us``, ``after_seq`` or ``after_hash``. Raises what
    `Store.put_docs` raises (StoreFullError...) and changes nothing then; StoreError for a
    filtered replica's store (`store/prune.py`).
    """
    held = held_keyspaces(store)
    if held is not None:
        # A filtered replica holds a part of the keys and none of the idempotency
        # answers (`store/filtered.py`): as a root it would answer for keys it lacks.
        raise StoreError(
            f"this store holds only keys under {describe(held)}: a filtered replica's "
            "store cannot become a root's",
            hint="promote a full replica",
        )
    t = time_us or now_us()
    seq, head = store.head()
    body = {**(extra or {}), "promoted_us": t, "after_seq": seq, "after_hash": head.hex()}
    out = store.put_docs({PROMOTION_DOC: json.dumps(body, sort_keys=True).encode()}, time_us=t)
    return Promotion(
        after_seq=seq,
        after_hash=head.hex(),
        time_us=t,
        seq=out.last_seq,
        has_admin=store.get_doc(ADMIN_HASH) is not None,
        has_acl=store.get_doc(ACL_DOC) is not None,
    )


def last_promotion(store: Store) -> dict[str, object] | None:
    """The ``promotion`` document of `store` (its JSON fields), or None when its history
    never changed root."""
    doc = store.get_doc(PROMOTION_DOC)
    if doc is None:
        return None
    out: dict[str, object] = json.loads(doc.body)
    out["seq"] = doc.seq
    return out
