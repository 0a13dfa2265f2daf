"""Keyspaces of a filtered replica: the pure rules (no I/O).

A replica started with ``--keyspace PREFIX`` (repeatable) holds only the user keys under
those prefixes. These rules decide what a prefix list is (`normalize`), whether a source
can feed a replica (`refusal`: a full source feeds any subset, a filtered source only a
subset of its own prefixes, and never a full replica), and whether a read falls inside
(`holds_key`; a range: `store.filtered.holds_range`). The bytes of filtered records are
`store/filtered.py`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from replicator.frames import MAX_KEYSPACES, MAX_PREFIX
from store.filtered import describe

Prefixes = tuple[bytes, ...]


def normalize(prefixes: Iterable[bytes]) -> Prefixes:
    """The prefixes sorted, without repeats and without any another one already covers
    (``a/`` makes ``a/b/`` redundant). ValueError on none, too many, an empty prefix or one
    longer than a key may be."""
    ps = sorted(set(prefixes))
    if not ps:
        raise ValueError("a filtered replica needs at least one --keyspace prefix")
    for p in ps:
        if not 1 <= len(p) <= MAX_PREFIX:
            raise ValueError(f"a keyspace prefix has 1..{MAX_PREFIX} bytes, not {len(p)}")
    out: list[bytes] = []
    for p in ps:  # sorted: a covering prefix comes before every prefix it covers
        if not any(p.startswith(q) for q in out):
            out.append(p)
    if len(out) > MAX_KEYSPACES:
        raise ValueError(f"at most {MAX_KEYSPACES} keyspace prefixes, not {len(out)}")
    return tuple(out)


def holds_key(held: Prefixes | None, key: bytes) -> bool:
    """Whether a node holding `held` (None: everything) holds `key`."""
    return held is None or key.startswith(held)


def covers(held: Prefixes | None, asked: Sequence[bytes]) -> bool:
    """Whether every key under `asked` is under `held` (None: everything)."""
    return held is None or all(a.startswith(held) for a in asked)


def refusal(held: Prefixes | None, asked: Prefixes | None) -> str | None:
    """Why a source holding `held` (None: everything) cannot feed a replica asking for
    `asked` (None: a full replica), or None when it can."""
    if held is None:
        return None
    if asked is None:
        return (
            f"this source is a filtered replica holding only keys under {describe(held)}; "
            "a full replica needs a full source"
        )
    outside = [a for a in asked if not a.startswith(held)]
    if outside:
        return (
            f"keyspaces {describe(outside)} are not held by this source, a filtered replica "
            f"holding only keys under {describe(held)}; use a source that holds them"
        )
    return None
