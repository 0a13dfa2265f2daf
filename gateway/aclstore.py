"""The ACL's persistence: one replicated document, written through the log with its audit
record in one transaction.

The ACL (`acl.model.Acl.to_json()`, token hashes included, never a token) is the
replicated document ``acl`` (`store/docs.py`): every replica holds it, so a replica can
check tokens and a promoted replica keeps its producers. Its version is the seq of the log
entry that wrote it (the ``ETag`` of ``GET /v1/admin/acl``). Each change writes an audit
record (`acl/audit.py`) in the same transaction: the history cannot miss a change, nor
record one that did not commit.

`commit` blocks (one LMDB write transaction): the gateway runs it in its commit thread,
serialised with the batches.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import orjson

from acl import audit
from acl.model import DOC_NAME, Acl
from store.batchwrite import now_us
from store.docs import ADMIN_HASH
from store.store import Store


@dataclass(frozen=True, slots=True)
class Change:
    """What an admin call changed, for its audit record."""

    who: str
    action: str
    target: str
    diff: tuple[str, ...] = ()


def load(store: Store) -> tuple[Acl, int]:
    """The ACL in the store and its version (0 when there is none yet)."""
    doc = store.get_doc(DOC_NAME)
    if doc is None:
        return Acl(), 0
    return Acl.from_json(orjson.loads(doc.body)), doc.seq


def version(store: Store) -> int:
    """The version of the stored ACL (0 when there is none yet)."""
    doc = store.get_doc(DOC_NAME)
    return 0 if doc is None else doc.seq


def commit(store: Store, acl: Acl, change: Change | None) -> int:
    """Write `acl` (and the audit record of `change`) through the log in one transaction;
    return the new version."""
    t = now_us()
    docs: dict[str, bytes | None] = {DOC_NAME: orjson.dumps(acl.to_json())}
    if change is not None:
        docs[audit.name(t, secrets.token_hex(4))] = audit.record(
            change.who, change.action, change.target, list(change.diff), t
        )
    store.put_docs(docs, time_us=t)
    return version(store)


def commit_admin_hash(store: Store, admin_hash: str, change: Change) -> None:
    """Write the admin token's new hash (the replicated document ``admin_token_hash``) and
    the audit record of `change` through the log in one transaction: every candidate and
    replica holds the new hash, so the old token stays refused after a failover too."""
    t = now_us()
    store.put_docs(
        {
            ADMIN_HASH: admin_hash.encode(),
            audit.name(t, secrets.token_hex(4)): audit.record(
                change.who, change.action, change.target, list(change.diff), t
            ),
        },
        time_us=t,
    )
