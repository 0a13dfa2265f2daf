"""The cache node's persistent store: one LMDB environment in DATA_DIR.

Two sub-databases: ``entries`` (key -> read seq u64, version u64, flags u8, value; flag 1:
a negative entry, the key is absent) and ``meta`` (the applied seq, the horizon and the db
id of the store it caches). Every change the state machine (`cache.state`) decides is one
write transaction: an invalidation's deletions with the applied seq it reaches, an
answer's entry with the evictions it caused and the horizon — so after a crash or restart
the entries, the applied seq and the horizon always agree, and the node starts warm.

Commits are not fsynced (`sync=False`): a cache holds nothing that is not on its source.
A machine crash may lose the last transactions, never their order or atomicity (LMDB), so
what is left is a consistent earlier state: entries valid at the applied seq stored beside
them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import lmdb

from cache.state import Held

_ENTRY = struct.Struct("<QQB")
_U64 = struct.Struct("<Q")
FLAG_NEGATIVE = 1
K_APPLIED = b"applied"
K_HORIZON = b"horizon"
K_DB_ID = b"db_id"
#: The keys of the policy's protected segment, written at a clean stop (`save_protected`):
#: a restart puts them back there, so the hot set survives a scan right after it.
K_PROTECTED = b"protected"
_KLEN = struct.Struct("<H")


class Put(NamedTuple):
    key: bytes
    held: Held
    value: bytes | None


class CacheStore:
    """The LMDB store of a cache node (see module docstring)."""

    def __init__(self, path: str, max_bytes: int) -> None:
        os.makedirs(path, exist_ok=True)
        self.path = path
        # Room for the budget several times over (page slack, a fragmented free list):
        # the map is address space, not disk; the file grows with what is held.
        self.env: Any = lmdb.open(
            path,
            map_size=max(1 << 30, 8 * max_bytes),
            max_dbs=2,
            sync=False,
            metasync=False,
            readahead=False,
        )
        self.entries = self.env.open_db(b"entries")
        self.meta = self.env.open_db(b"meta")

    def close(self) -> None:
        self.env.sync(True)
        self.env.close()

    def _meta_u64(self, key: bytes) -> int:
        with self.env.begin(db=self.meta) as txn:
            raw = txn.get(key)
        return 0 if raw is None else int(_U64.unpack(raw)[0])

    def applied(self) -> int:
        return self._meta_u64(K_APPLIED)

    def horizon(self) -> int:
        return self._meta_u64(K_HORIZON)

    def db_id(self) -> bytes | None:
        """The db id of the store cached (None: never connected)."""
        with self.env.begin(db=self.meta) as txn:
            raw = txn.get(K_DB_ID)
        return None if raw is None else bytes(raw)

    def load(self) -> Iterator[tuple[bytes, Held, int]]:
        """Every entry: (key, what the state holds of it, its size as the policy counts it)."""
        with self.env.begin(db=self.entries) as txn:
            for key, raw in txn.cursor():
                read_seq, version, flags = _ENTRY.unpack_from(raw)
                negative = bool(flags & FLAG_NEGATIVE)
                vlen = len(raw) - _ENTRY.size
                yield bytes(key), Held(read_seq, version, negative), vlen

    def get(self, key: bytes) -> tuple[Held, bytes | None] | None:
        with self.env.begin(db=self.entries) as txn:
            raw = txn.get(key)
            if raw is None:
                return None
            read_seq, version, flags = _ENTRY.unpack_from(raw)
            negative = bool(flags & FLAG_NEGATIVE)
            value = None if negative else bytes(raw[_ENTRY.size :])
        return Held(read_seq, version, negative), value

    def commit(
        self,
        *,
        puts: Sequence[Put] = (),
        deletes: Sequence[bytes] = (),
        applied: int | None = None,
        horizon: int | None = None,
        db_id: bytes | None = None,
        clear: bool = False,
    ) -> None:
        """One write transaction: `clear` empties the entries first."""
        with self.env.begin(write=True) as txn:
            if clear:
                txn.drop(self.entries, delete=False)
            for key in deletes:
                txn.delete(key, db=self.entries)
            for key, held, value in puts:
                flags = FLAG_NEGATIVE if held.negative else 0
                raw = _ENTRY.pack(held.read_seq, held.version, flags) + (value or b"")
                txn.put(key, raw, db=self.entries)
            if applied is not None:
                txn.put(K_APPLIED, _U64.pack(applied), db=self.meta)
            if horizon is not None:
                txn.put(K_HORIZON, _U64.pack(horizon), db=self.meta)
            if db_id is not None:
                txn.put(K_DB_ID, db_id, db=self.meta)

    def save_protected(self, keys: list[bytes]) -> None:
        """Record the protected keys (one value in ``meta``: lengths and keys)."""
        raw = b"".join(_KLEN.pack(len(k)) + k for k in keys)
        with self.env.begin(write=True) as txn:
            txn.put(K_PROTECTED, raw, db=self.meta)

    def take_protected(self) -> set[bytes]:
        """The protected keys last saved, forgotten as they are read (a crash after this
        start must not restore a list older than what the node then held)."""
        with self.env.begin(write=True) as txn:
            raw = txn.pop(K_PROTECTED, db=self.meta)
        out: set[bytes] = set()
        mv = memoryview(raw or b"")
        pos = 0
        while pos + _KLEN.size <= len(mv):
            (n,) = _KLEN.unpack_from(mv, pos)
            pos += _KLEN.size
            out.add(bytes(mv[pos : pos + n]))
            pos += n
        return out

    def disk_bytes(self) -> int:
        """Bytes of the LMDB file on disk (allocated blocks: a sparse file counts what it
        uses)."""
        st = os.stat(os.path.join(self.path, "data.mdb"))
        return int(st.st_blocks * 512)
