"""Per-owner usage counters: their record format and the arithmetic, free of I/O.

A usage record (in the ``meta`` sub-database under key ``b"usage:"`` + owner UTF-8, so that
the empty owner of unattributed writes has a key too) is seven u64
little-endian: keys, bytes, writes, deletes, duplicates, throttled, expiries (format 7: the
keys the root's expirer removed, apart from the producer's own deletes; a six-field record
of an older store reads with 0 expiries, and the next change of its owner writes seven).
``bytes`` counts what a key costs in the store: key length + value length + the record's
metadata (`RECORD_FIXED` + owner length), so that a storage quota charges what the disk
holds.
"""

from __future__ import annotations

import builtins
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from store.format import RECORD_FIXED

_USAGE = struct.Struct("<7Q")
_USAGE_6 = struct.Struct("<6Q")  # before format 7: no expiries


@dataclass(slots=True)
class Usage:
    """Counters of one owner."""

    keys: int = 0
    bytes: int = 0
    writes: int = 0
    deletes: int = 0
    duplicates: int = 0
    throttled: int = 0
    expiries: int = 0

    def encode(self) -> builtins.bytes:
        """The 56-byte usage record."""
        return _USAGE.pack(
            self.keys,
            self.bytes,
            self.writes,
            self.deletes,
            self.duplicates,
            self.throttled,
            self.expiries,
        )

    @classmethod
    def decode(cls, raw: builtins.bytes | None) -> Usage:
        """Decode a usage record; None gives zeroes."""
        if raw is None:
            return cls()
        if len(raw) == _USAGE_6.size:
            return cls(*_USAGE_6.unpack(raw))
        return cls(*_USAGE.unpack(raw))

    def add(self, other: Usage) -> None:
        """Add `other`'s counters to these (other's may be negative deltas)."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        """Counters by name."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def stored_bytes(key_len: int, value_len: int, owner_len: int) -> int:
    """What one key costs its owner: key + value + record metadata."""
    return key_len + value_len + RECORD_FIXED + owner_len


USAGE_PREFIX = b"usage:"


def usage_key(owner: str) -> bytes:
    """Key of `owner`'s usage record in the meta sub-database."""
    return USAGE_PREFIX + owner.encode()


# -- keys and stored bytes per keyspace ---------------------------------------------------
#
# The owner counters above cannot split an owner's keys by keyspace. For owners with
# several keyspaces the root keeps (keys, bytes) per (owner, keyspace) in the ``meta``
# sub-database too, updated in each batch's own transaction (`store/batchwrite.py`):
# ``b"ksusage:" + owner + b"\x00" + keyspace`` -> two i64 little-endian. They are local to
# the node that writes them (not logged): ``K_KS_AT`` holds the last seq at which they were
# exact, and a node whose log moved on without them (a replica, a restored snapshot, a store
# from before they existed) recounts them once when the gateway hands it its keyspaces.

KS_USAGE_PREFIX = b"ksusage:"
K_KS_AT = b"ksusage-at"
K_KS_SET = b"ksusage-set:"
_KS = struct.Struct("<2q")

#: owner -> its keyspace prefixes (UTF-8), longest first.
KsTable = dict[str, tuple[builtins.bytes, ...]]
#: (owner, keyspace prefix) -> [keys, bytes] increments.
KsDelta = dict[tuple[str, builtins.bytes], list[int]]


def ks_usage_key(owner: str, keyspace: builtins.bytes) -> builtins.bytes:
    """Key of one (owner, keyspace) record in the meta sub-database."""
    return KS_USAGE_PREFIX + owner.encode() + b"\x00" + keyspace


def ks_set_key(owner: str) -> builtins.bytes:
    """Key of the record naming the keyspaces `owner`'s records were counted for."""
    return K_KS_SET + owner.encode()


def ks_encode(keys: int, nbytes: int) -> builtins.bytes:
    return _KS.pack(keys, nbytes)


def ks_decode(raw: builtins.bytes | None) -> tuple[int, int]:
    return (0, 0) if raw is None else _KS.unpack(raw)


def ks_table(keyspaces: Mapping[str, Sequence[str]]) -> KsTable:
    """The table for the owners with more than one keyspace (one keyspace's figures are
    its owner's, which the owner counters already hold)."""
    return {
        owner: tuple(sorted((k.encode() for k in kss), key=len, reverse=True))
        for owner, kss in keyspaces.items()
        if len(kss) > 1
    }


def keyspace_of(prefixes: tuple[builtins.bytes, ...], key: builtins.bytes) -> builtins.bytes | None:
    """The longest of `prefixes` that `key` starts with, or None."""
    for p in prefixes:
        if key.startswith(p):
            return p
    return None


def record_owner_size(key: builtins.bytes, raw: builtins.bytes) -> tuple[str, int]:
    """(owner, stored bytes) of a stored value record (`store/format.py`)."""
    vlen = int.from_bytes(raw[10:14], "little")
    n = raw[18]
    return bytes(raw[19 : 19 + n]).decode(), stored_bytes(len(key), vlen, n)


def ks_bump(
    delta: KsDelta, table: KsTable, key: builtins.bytes, state: tuple[str, int] | None, sign: int
) -> None:
    """Add (sign x) one key of `state` = (owner, stored bytes) to `delta`."""
    if state is None:
        return
    prefixes = table.get(state[0])
    if prefixes is None:
        return
    ks = keyspace_of(prefixes, key)
    if ks is None:
        return
    d = delta.get((state[0], ks))
    if d is None:
        d = delta[(state[0], ks)] = [0, 0]
    d[0] += sign
    d[1] += sign * state[1]
