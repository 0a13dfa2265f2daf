"""Format 3 → 4: the value record's CRC covers the user key too.

Up to format 3 a record's CRC covered its own bytes and the value but not the key it is
stored under, so a flipped key byte went unnoticed (and could make B-tree neighbours
unreachable). Format 4 seeds the CRC with the key (`store/format.py`). This step checks
every record against its format-3 CRC first — a record that fails it (and is not already
signed the format-4 way) is corrupt, and re-signing it would hide that, so the step stops
and nothing changes — then rewrites the CRC field in place (the record's length and layout
do not change).
"""

from __future__ import annotations

import struct
import zlib

from core import failpoints
from core.errors import CorruptionError
from migrations.plan import Step
from store import codec
from store.format import FLAG_CHUNKED, record_crc
from store.migration import MigrationTxn, Progress

_U32 = struct.Struct("<I")


def _v3_crc(rec: bytes, value: bytes, value_offset: int) -> int:
    """Format 3's record CRC: bytes [0:14] ++ bytes [18:value_offset] ++ the value."""
    return zlib.crc32(value, zlib.crc32(rec[18:value_offset], zlib.crc32(rec[:14])))


def _apply(mtx: MigrationTxn, progress: Progress) -> None:
    seen = 0

    def resign(key: bytes, rec: bytes) -> bytes:
        nonlocal seen
        seen += 1
        if seen % 10_000 == 0:
            progress(10_000)
            failpoints.hit("migrate.0004.mid_scan")
        try:
            h = codec.decode_record_header(rec)
        except ValueError as err:
            raise CorruptionError(f"key {key!r}: malformed value record", key=key) from err
        if h.flags & FLAG_CHUNKED:
            value = mtx.value_chunks(h.seq, h.vlen)
            if value is None:
                raise CorruptionError(f"key {key!r}: chunks missing", key=key)
        else:
            value = rec[h.value_offset :]
        crc = record_crc(key, rec[:14], rec[18 : h.value_offset], value)
        if crc == h.crc:  # already covers the key
            return rec
        if _v3_crc(rec, value, h.value_offset) != h.crc:
            raise CorruptionError(
                f"key {key!r}: value record fails its CRC; not re-signed",
                key=key,
                hint="restore this node from a healthy one, then migrate",
            )
        return rec[:14] + _U32.pack(crc) + rec[18:]

    mtx.rewrite_data(resign)
    failpoints.hit("migrate.0004.before_commit")


STEP = Step(
    from_version=3,
    name="0004_key_checksum",
    description="value records: the CRC covers the key too (every record re-signed, "
    "each checked against its old CRC first)",
    apply=_apply,
)
