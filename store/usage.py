"""Per-owner usage counters: their record format and the arithmetic, free of I/O.

A usage record (in the ``meta`` sub-database under key ``b"usage:"`` + owner UTF-8, so that
the empty owner of unattributed writes has a key too) is six u64
little-endian: keys, bytes, writes, deletes, duplicates, throttled. ``bytes`` counts what a
key costs in the store: key length + value length + the record's metadata (`RECORD_FIXED` +
owner length), so that a storage quota charges what the disk holds.
"""

from __future__ import annotations

import builtins
import struct
from dataclasses import dataclass, fields

from store.format import RECORD_FIXED

_USAGE = struct.Struct("<6Q")


@dataclass(slots=True)
class Usage:
    """Counters of one owner."""

    keys: int = 0
    bytes: int = 0
    writes: int = 0
    deletes: int = 0
    duplicates: int = 0
    throttled: int = 0

    def encode(self) -> builtins.bytes:
        """The 48-byte usage record."""
        return _USAGE.pack(
            self.keys, self.bytes, self.writes, self.deletes, self.duplicates, self.throttled
        )

    @classmethod
    def decode(cls, raw: builtins.bytes | None) -> Usage:
        """Decode a usage record; None gives zeroes."""
        if raw is None:
            return cls()
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
