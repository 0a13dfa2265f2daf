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


def put(txn: Any, db: Any, ns: bytes, seq: int, data: bytes) -> None:
    """Store `data` as chunks under (ns, seq)."""
    mv = memoryview(data)
    for i, off in enumerate(range(0, len(data), CHUNK_SIZE)):
        txn.put(key(ns, seq, i), mv[off : off + CHUNK_SIZE], db=db)


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
