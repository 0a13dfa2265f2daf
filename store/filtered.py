"""Filtered log records: the bytes a keyspace-filtered replica receives and stores (pure).

A filtered replica (`mercury replica --keyspace PREFIX`) holds only the user keys under its
prefixes. Its source ships each log record with the entries it does not hold replaced by
*skip items*, and the replica stores that record as it came, so that it can in turn feed a
replica of a narrower subset.

Filtered record: the log record header of `store/format.py` with flag bit 1
(`FLAG_FILTERED`) set and its CRC recomputed over the new payload; first seq, entry count,
commit time and hash head are the original record's, so a filtered replica's head at every
record boundary is the root's (heartbeat heads and record comparisons work unchanged). The
payload is snappy (raw) of a sequence of items, each one of:

- a log entry, byte for byte as in the original record (`format.ENTRY_HEADER` ...);
- a skip item standing for ``count`` consecutive entries the replica does not hold, laid
  out as an entry header with op `OP_SKIP` (0x80), owner and key lengths 0, value length
  68, then the value::

      0   4   count (u32, >= 1): entries skipped, from the item's seq on
      4   32  hash head before the first skipped entry
      36  32  hash head after the last skipped entry

Items are numbered like entries: an entry or skip item starts at the seq after the
previous item; the items cover exactly the header's entry count.

What the replica checks (`scan`): every item's seq and the total count (so every gap,
repeat or reorder of entries is seen), every kept entry's fields as `store/replay.py` does,
and the hash chain through every kept entry: from its head before the record, each kept
entry is folded in; at a skip item the head so computed must equal the item's *before*
hash, and the chain goes on from its *after* hash; at the end it must equal the header's
hash head. So every kept byte is covered by the source's chain, and a wrong *after* hash is
caught at the next check point. What it cannot check: that the skipped entries themselves
are what the root committed — their *after* hashes are the source's word.

Which entries a filter keeps (`keeps`): sets, deletes and any other op naming a user key,
when the key is under one of the prefixes; replicated documents (op 3: the ACL, audit
records, the admin token's hash) always, since a filtered replica authenticates its readers
with them; idempotency answers (op 3 with a NUL-led key) never — they serve only a promoted
root, and a filtered store can never be promoted.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import cramjam

from store import codec
from store import format as fmt
from store.nodedocs import is_answer

#: Log record header flag: the payload is a filtered one (items, not plain entries).
FLAG_FILTERED = 0x02
#: The op code of a skip item (never a log entry's: ops are small numbers).
OP_SKIP = 0x80
_SKIP = struct.Struct("<I32s32s")  # count, hash before, hash after
SKIP_VALUE = _SKIP.size  # 68
_HDR = fmt.ENTRY_HEADER


class SkipMismatch(ValueError):
    """A skip item's *before* hash is not the head the replica computed there: the kept
    bytes, or the head the replica started from, differ from the source's chain."""


def describe(prefixes: Sequence[bytes]) -> str:
    """Prefixes as an operator reads them: ``'a/', 'b/'``."""
    return ", ".join(repr(p.decode("utf-8", "replace")) for p in prefixes)


def under(key: bytes, prefixes: Sequence[bytes]) -> bool:
    """Whether `key` lies under one of `prefixes`."""
    return any(key.startswith(p) for p in prefixes)


def past(prefix: bytes) -> bytes | None:
    """The first key after every key under `prefix` (None: there is none, the prefix is
    all 0xff bytes)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return None
    p[-1] += 1
    return bytes(p)


def holds_range(held: Sequence[bytes] | None, start: bytes, end: bytes | None) -> bool:
    """Whether every key in [`start`, `end`) (end None: no upper bound) lies under one
    prefix of `held`: the range starts under a prefix and ends at or before the first key
    past it."""
    if held is None:
        return True
    for p in held:
        if not start.startswith(p):
            continue
        bound = past(p)
        if bound is None or (end is not None and end <= bound):
            return True
    return False


def keeps(prefixes: Sequence[bytes]) -> Callable[[int, bytes], bool]:
    """The rule of what a replica of `prefixes` holds, as ``keep(op, key)`` (module doc)."""
    ps = tuple(prefixes)

    def keep(op: int, key: bytes) -> bool:
        if op == fmt.OP_DOC:
            return not is_answer(key)
        return key.startswith(ps)

    return keep


def is_filtered(header: bytes) -> bool:
    """Whether a stored or shipped log record `header` holds a filtered payload."""
    return bool(header[1] & FLAG_FILTERED)


def skip_item(seq: int, count: int, before: bytes, after: bytes) -> bytes:
    """The bytes of one skip item."""
    return _HDR.pack(seq, OP_SKIP, 0, 0, SKIP_VALUE) + _SKIP.pack(count, before, after)


def filter_payload(
    raw: Any,
    prev_head: bytes,
    keep: Callable[[int, bytes], bool],
    alg: int = fmt.CHAIN_BLAKE2B,
) -> tuple[bytes, bytes, int]:
    """Filter the decompressed payload `raw` of a plain or filtered record, whose chain
    starts at `prev_head`: (the filtered payload, the head after it, entries kept).

    Dropped entries and skip items next to each other become one skip item. The input's
    skip items are trusted (this node checked them when it applied the record), their
    *before* hashes too: a filtered source re-filters what it stores."""
    mv = memoryview(raw)
    out: list[bytes | memoryview] = []
    h = prev_head
    pos, n, hs = 0, len(mv), _HDR.size
    run_seq = run_count = 0
    run_before = b""
    kept = 0
    while pos < n:
        if pos + hs > n:
            raise ValueError("truncated entry header")
        seq, op, on, kn, vn = _HDR.unpack_from(mv, pos)
        end = pos + hs + on + kn + vn
        if end > n:
            raise ValueError(f"entry at seq {seq} runs past the payload")
        if op == OP_SKIP:
            count, _before, after = _SKIP.unpack_from(mv, pos + hs)
            if not run_count:
                run_seq, run_before = seq, h
            run_count += count
            h = after
        else:
            entry = mv[pos:end]
            key = bytes(mv[pos + hs + on : pos + hs + on + kn])
            if keep(op, key):
                if run_count:
                    out.append(skip_item(run_seq, run_count, run_before, h))
                    run_count = 0
                out.append(entry)
                kept += 1
            elif not run_count:
                run_seq, run_before, run_count = seq, h, 1
            else:
                run_count += 1
            h = fmt.chain(h, entry, alg)
        pos = end
    if run_count:
        out.append(skip_item(run_seq, run_count, run_before, h))
    return b"".join(out), h, kept


def filter_record(
    header: bytes,
    payload: bytes,
    prev_head: bytes,
    keep: Callable[[int, bytes], bool],
    alg: int = fmt.CHAIN_BLAKE2B,
) -> tuple[bytes, bytes, bytes]:
    """A stored record (`header`, compressed `payload`) as the filtered record a replica
    of `keep` receives: (header, payload, the head after it). The head is the record's own
    when `prev_head` is the head before it on this node's chain."""
    lh = fmt.decode_log_header(header)
    raw = cramjam.snappy.decompress_raw(payload)
    items, head, _kept = filter_payload(raw, prev_head, keep, alg)
    packed = bytes(cramjam.snappy.compress_raw(items))
    flags = lh.flags | FLAG_FILTERED
    new_header = fmt.encode_log_header(
        flags, lh.first_seq, lh.num_entries, lh.time_us, lh.hash_head, packed
    )
    return new_header, packed, head


def scan(
    raw: Any, prev_head: bytes, first_seq: int, num_entries: int, alg: int = fmt.CHAIN_BLAKE2B
) -> tuple[bytes, bytes]:
    """Check a filtered payload (module doc): (the hash head after it, the kept entries
    joined — a plain payload `codec.apply_entries` applies).

    Each run of kept entries between skip items goes through `codec.scan_entries`, the one
    home of the rules an entry must meet (and the chain over it), so a filtered replica
    accepts exactly the entries a full one does. Raises SkipMismatch where the chain
    disagrees with a skip item, ValueError naming the first item no store accepts; the
    caller compares the head with the record's."""
    mv = memoryview(raw)
    h = prev_head
    pos, n, hs = 0, len(mv), _HDR.size
    expect = first_seq
    kept: list[memoryview] = []
    run_start, run_seq, run_count = 0, first_seq, 0

    def close_run(end: int) -> bytes:
        if not run_count:
            return h
        run = mv[run_start:end]
        kept.append(run)
        try:
            return bytes(codec.scan_entries(run, h, run_seq, run_count, alg))
        except ValueError as err:
            raise ValueError(f"kept entries from seq {run_seq}: {err}") from err

    while pos < n:
        if pos + hs > n:
            raise ValueError("truncated entry header")
        seq, op, on, kn, vn = _HDR.unpack_from(mv, pos)
        if seq != expect:
            raise ValueError(f"item at seq {seq}, expected {expect}")
        end = pos + hs + on + kn + vn
        if end > n:
            raise ValueError(f"item at seq {seq} runs past the payload")
        if op == OP_SKIP:
            h = close_run(pos)
            run_count = 0
            if on or kn or vn != SKIP_VALUE:
                raise ValueError(f"skip item at seq {seq} is malformed")
            count, before, after = _SKIP.unpack_from(mv, pos + hs)
            if count < 1:
                raise ValueError(f"skip item at seq {seq} skips nothing")
            if bytes(before) != h:
                raise SkipMismatch(f"hash chain differs from the source's before seq {seq}")
            h = bytes(after)
            expect += count
        else:
            if not run_count:
                run_start, run_seq = pos, seq
            run_count += 1
            expect += 1
        pos = end
    h = close_run(n)
    if expect - first_seq != num_entries:
        raise ValueError(f"items cover {expect - first_seq} entries, the header says {num_entries}")
    return h, b"".join(kept)


def entries_of(header: bytes, raw: Any) -> Any:
    """The plain entries of a decompressed payload (a filtered one without its skip
    items; a plain one as it is): for readers of the log, whose chain was checked when the
    record was applied."""
    if not is_filtered(header):
        return raw
    mv = memoryview(raw)
    out: list[memoryview] = []
    pos, n, hs = 0, len(mv), _HDR.size
    while pos + hs <= n:
        _seq, op, on, kn, vn = _HDR.unpack_from(mv, pos)
        end = pos + hs + on + kn + vn
        if op != OP_SKIP:
            out.append(mv[pos:end])
        pos = end
    return b"".join(out)
