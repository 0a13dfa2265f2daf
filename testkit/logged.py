"""What a store's log holds after a seq, entry by entry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from store.ops import LogRecord
from store.store import Store


def records(store: Store, from_seq: int) -> Iterator[LogRecord]:
    """Every log record of `store` from the one holding `from_seq` to its last, in order
    (`Store.read_log`'s LogRetentionError when `from_seq` is no longer retained)."""
    nxt = from_seq
    while nxt <= store.last_seq():
        recs = store.read_log(nxt, max_records=1000)
        if not recs:
            return
        yield from recs
        nxt = recs[-1].last_seq + 1


def entries_since(data_dir: str | Path, seq: int) -> list[tuple[int, bytes]]:
    """(op, key) of every log entry committed in `data_dir` after `seq`, read from its store.
    A root also logs documents of its own at any time (usage series at a minute's turn, the
    read ledger), so a test counts the entries it caused, not seq deltas."""
    return [(op, key) for _, op, key in seqs_since(data_dir, seq)]


def seqs_since(data_dir: str | Path, seq: int) -> list[tuple[int, int, bytes]]:
    """(seq, op, key) of every log entry committed in `data_dir` after `seq`."""
    from store import codec, filtered, replica_apply

    out: list[tuple[int, int, bytes]] = []
    with Store.open(str(data_dir), readonly=True) as store:
        for rec in records(store, seq + 1):
            raw = filtered.entries_of(rec.header, replica_apply.payload(rec))
            entries = codec.decode_entries(raw)
            out += [(e.seq, e.op, bytes(e.key)) for e in entries if e.seq > seq]
    return out
