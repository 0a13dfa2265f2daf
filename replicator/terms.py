"""The leadership term a store holds, and the rule a replica applies to its sources.

An HA leader records its term in the replicated `store.terms.TERM_DOC` before it
acknowledges anything (`ha/leader.py`), so every node's store holds the newest term
it has applied. A source tells a term-aware replica its store's term in WELCOME
(`frames.OPT_TERM`); a replica that already holds a newer term refuses that source: it is
a deposed leader still running out its lease, or a node still following one. Following it
would at best stream nothing (its standbys left it) and at worst make the replica see its
head fall behind and stop as diverged.
"""

from __future__ import annotations

from store.store import Store
from store.terms import TERM_DOC, decode_term


def store_term(store: Store) -> int:
    """The term recorded in `store` (0: none yet, a hand promotion, or unreadable)."""
    doc = store.get_doc(TERM_DOC)
    if doc is None:
        return 0
    try:
        return decode_term(doc.body)
    except ValueError:
        return 0


def source_too_old(source_term: int | None, own_term: int) -> bool:
    """Whether a source of `source_term` (None: it did not say) is behind a newer term this
    replica already holds. Term 0 names no term (a promotion by hand): never refused."""
    return source_term is not None and 0 < source_term < own_term
