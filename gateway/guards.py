"""Keyspace write guards: refuse empty values, cap deletes per batch. Pure (no I/O)."""

from __future__ import annotations

from collections.abc import Callable

from acl.model import Producer
from core.errors import WriteGuardError
from store.ops import DELETE, SET, Op


def check_guards(
    p: Producer, ops: list[Op], open_deletes: Callable[[str, str], int]
) -> dict[str, int]:
    """Apply `p`'s keyspace write guards; return deletes per guarded keyspace.

    `open_deletes(producer, keyspace)` counts that producer's deletes already in the open
    batch: the cap holds per batch, not per request.
    """
    if not p.guards:
        return {}
    deletes: dict[str, int] = {}
    guards = [(ks.encode(), ks, g) for ks, g in p.guards.items()]
    for op in ops:
        for prefix, ks, g in guards:
            if not op.key.startswith(prefix):
                continue
            if op.op == SET and g.refuse_empty and not op.value:
                raise WriteGuardError(
                    f"keyspace {ks!r} refuses empty values "
                    f"(key {op.key.decode('utf-8', 'backslashreplace')!r})",
                    producer=p.name,
                    keyspace=ks,
                )
            if op.op == DELETE and g.max_deletes_per_batch is not None:
                deletes[ks] = deletes.get(ks, 0) + 1
    for ks, n in deletes.items():
        cap = p.guards[ks].max_deletes_per_batch
        total = n + open_deletes(p.name, ks)
        if cap is not None and total > cap:
            raise WriteGuardError(
                f"keyspace {ks!r} allows at most {cap} deletes per batch; this request "
                f"would make {total}",
                producer=p.name,
                keyspace=ks,
                hint="delete in smaller steps",
            )
    return deletes
