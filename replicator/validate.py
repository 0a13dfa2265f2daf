"""Checks a replicated log record's entries before the store applies them (pure, no I/O).

The store checks a record's CRC and hash chain; this checks what LMDB itself would choke
on (a 600-byte key raises deep inside py-lmdb and, uncaught, restarted the worker in a
loop): every entry's op code, key length (1..MAX_KEY), value size (at most MAX_VALUE; none
for a delete) and numbering (contiguous from the record's first seq). A record that fails
stops replication with `InvalidRecordError` naming the seq and the reason.
"""

from __future__ import annotations

import cramjam

from core.errors import InvalidRecordError
from store.format import ENTRY_HEADER, MAX_KEY, MAX_VALUE, OP_DELETE, OP_DOC, OP_SET, log_crc_ok
from store.ops import LogRecord


def check_record(rec: LogRecord) -> None:
    """Raise InvalidRecordError when `rec` holds an entry no store may apply.

    A record failing its CRC or its compression is left to the store, which reports it as
    corruption (a damaged transfer: the replica reconnects and fetches it again).
    """
    if not log_crc_ok(rec.header, rec.payload):
        return
    try:
        raw = memoryview(cramjam.snappy.decompress_raw(rec.payload))
    except Exception:  # snappy's own error types; the store names it
        return
    check_entries(rec.first_seq, rec.num_entries, raw)


def check_entries(first_seq: int, num_entries: int, raw: bytes | memoryview) -> None:
    """Check the decompressed entries `raw` of a record starting at `first_seq`."""
    pos, n, hs = 0, len(raw), ENTRY_HEADER.size
    count = 0
    while pos < n:
        if pos + hs > n:
            raise _bad(first_seq, "truncated entry header")
        seq, op, on, kn, vn = ENTRY_HEADER.unpack_from(raw, pos)
        if seq != first_seq + count:
            raise _bad(first_seq, f"entry {count} has seq {seq}, expected {first_seq + count}")
        if op not in (OP_SET, OP_DELETE, OP_DOC):
            raise _bad(first_seq, f"entry at seq {seq} has unknown op code {op}")
        if not 1 <= kn <= MAX_KEY:
            raise _bad(first_seq, f"entry at seq {seq} has a key of {kn} bytes (1..{MAX_KEY})")
        if vn > MAX_VALUE or (op == OP_DELETE and vn):
            raise _bad(first_seq, f"entry at seq {seq} has a value of {vn} bytes")
        pos += hs + on + kn + vn
        if pos > n:
            raise _bad(first_seq, f"entry at seq {seq} runs past the payload")
        count += 1
    if count != num_entries:
        raise _bad(first_seq, f"{count} entries, the header says {num_entries}")


def _bad(first_seq: int, why: str) -> InvalidRecordError:
    return InvalidRecordError(
        f"invalid log record at seq {first_seq}: {why}",
        seq=first_seq,
        hint="the source sent a record no store accepts; replication stopped. Check the "
        "source's version and integrity, then re-bootstrap this replica",
    )
