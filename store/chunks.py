"""Page-sized chunks of large values and large log payloads (``chunks`` sub-database).

Why: LMDB stores a large value in *contiguous* overflow pages; after churn the free space
is fragmented and a 25 MiB value forces the file to grow (the failure the original system
suffered). Chunks of `CHUNK_SIZE` each occupy exactly one page.
"""

from __future__ import annotations

import struct
from typing import Any

from store.format import CHUNK_SIZE

_KEY = struct.Struct(">cQI")
VALUE_NS = b"d"
LOG_NS = b"l"


def is_chunked(length: int) -> bool:
    """Whether a value or payload of `length` bytes is stored in chunks."""
    return length > CHUNK_SIZE


def put(txn: Any, db: Any, ns: bytes, seq: int, data: bytes | memoryview) -> None:
    """Store `data` as chunks under (ns, seq).

    One `putmulti` (LMDB's loop in C, not one Python call per chunk). Log chunks are
    appended: the log namespace sorts last and its seqs only grow, so LMDB's append mode
    (no tree descent, pages filled) takes them — 8x cheaper per chunk. Append refuses a
    key that is not the database's last; whatever it refused is then put normally.
    """
    mv = memoryview(data)
    items = [
        (_KEY.pack(ns, seq, i), mv[off : off + CHUNK_SIZE])
        for i, off in enumerate(range(0, len(data), CHUNK_SIZE))
    ]
    append = ns == LOG_NS
    _, added = txn.cursor(db=db).putmulti(items, append=append)
    if added != len(items):
        for k, v in items:
            txn.put(k, v, db=db)


def get(txn: Any, db: Any, ns: bytes, seq: int, length: int) -> bytes | None:
    """Reassemble `length` bytes stored under (ns, seq); None when a chunk is missing."""
    parts = []
    got = 0
    i = 0
    while got < length:
        part = txn.get(key(ns, seq, i), db=db)
        if part is None:
            return None
        parts.append(bytes(part))
        got += len(part)
        i += 1
    out = b"".join(parts)
    return out if len(out) == length else None


def delete(txn: Any, db: Any, ns: bytes, seq: int, length: int) -> None:
    """Delete the chunks of a `length`-byte blob stored under (ns, seq)."""
    for i in range((length + CHUNK_SIZE - 1) // CHUNK_SIZE):
        txn.delete(key(ns, seq, i), db=db)


def key(ns: bytes, seq: int, index: int) -> bytes:
    """Key of chunk `index` of the blob stored under (ns, seq)."""
    return _KEY.pack(ns, seq, index)


def parse_key(key: bytes) -> tuple[bytes, int, int]:
    """(ns, seq, index) of a chunk key."""
    ns, seq, idx = _KEY.unpack(key)
    return ns, seq, idx
