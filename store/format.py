"""On-disk and on-wire byte formats of the store — this docstring is the spec.

Pure-Python reference implementation. `store/_codec.pyx` implements the same functions in
Cython; `store/codec.py` picks one (``MERCURY_PURE=1`` forces this module). Golden files in
``tests/data/`` fail the suite if these bytes drift without a format version bump.

All integers are little-endian unless said otherwise. CRC is CRC-32 (zlib polynomial).

Value record (value of the ``data`` sub-database; the LMDB key is the user key)::

    off  size  field
    0    1     tag = 0x01
    1    1     flags: bit 0 = value is chunked (held in the ``chunks`` sub-database);
               bit 1 = the key has a deadline (format >= 7: it is in the ``expiry``
               sub-database, `store/expiry.py`; the record itself does not hold it)
    2    8     seq of the change that wrote this value (u64)
    10   4     value length V (u32, whole value even when chunked)
    14   4     CRC-32 over the user key ++ bytes [0:14] ++ bytes [18:] ++ the whole
               value (format >= 4; format 3 and older left the key out)
    18   1     owner length N (the producer that wrote the value; may be 0)
    19   N     owner, UTF-8
    19+N V     value bytes — only when not chunked

Chunks (``chunks`` sub-database): key ``b"d" ++ seq (u64 big-endian) ++ index (u32 BE)``
for values, ``b"l" ++ first seq (u64 BE) ++ index (u32 BE)`` for log payloads; each chunk
holds at most ``CHUNK_SIZE`` bytes so that it occupies one LMDB page: LMDB never needs a run
of free contiguous pages, whatever the value size.

Log entry (one per applied change, concatenated in a batch payload)::

    0    8     seq (u64)
    8    1     op: 1 = set, 2 = delete, 3 = replicated document (format >= 3),
               4 = set with a deadline, 5 = expiry (format >= 7)
    9    1     owner length N
    10   2     key length K (u16)
    12   4     value length V (u32; 0 for delete and expiry)
    16   N+K+V owner, key, value

Op 4 (format >= 7) is a set whose key expires: its value field is the deadline
(microseconds since the Unix epoch, u64) followed by the value, so V = 8 + the value's
length. Op 5 (format >= 7) is a delete that says it is an expiry: only the root logs one,
when the key's deadline is due (`gateway/expirer.py`), so every node removes the key at
the same seq; its owner is the key's owner. A set (op 1) of a key that had a deadline
clears it.

Op 3 sets the replicated document named by the key (UTF-8) in the ``docs`` sub-database to
the value, or removes it when the value is empty; its owner is empty. It never touches user
keys: readers of the log that replay user data (watch streams, exports) skip it.

Hash chain: ``h_seq = H(h_{seq-1} ++ entry bytes)``; ``h_0`` is 32 zero bytes. The entry
bytes include the seq, so a lost, reordered, duplicated or altered entry changes every later
link. ``H`` is the store's chain hash, fixed when its lineage began (`store/chainhash.py`,
recorded in ``meta``): SHA-256 (``CHAIN_SHA256``, new stores from format 6) or BLAKE2b-256
(``CHAIN_BLAKE2B``, the only one up to format 5). Both give 32 bytes.

Log record (value of the ``log`` sub-database; the LMDB key is the first seq, u64
big-endian, so that keys sort by seq)::

    0    1     tag = 0x01
    1    1     flags: bit 1 = a filtered record (a keyspace-filtered replica's: its payload
               holds skip items, `store/filtered.py`); the other bits 0
    2    8     first seq (u64)
    10   4     entry count (u32)
    14   8     commit time, microseconds since the Unix epoch (u64)
    22   32    hash head after the last entry of the record
    54   4     payload length P (u32; compressed)
    58   4     CRC-32 over bytes [0:58] ++ payload
    62   P     payload = snappy (raw format) of the concatenated log entries

A stored log record whose payload exceeds ``CHUNK_SIZE`` keeps only its 62-byte header in
the ``log`` sub-database (the payload goes to chunks): a stored value of exactly 62 bytes
with P > 0 is chunked. The header is the same either way, so the CRC and the replication
wire bytes do not depend on how a node stores them.

One log record holds one batch: the changes one write transaction applied. Replication ships
log records as they are (header + whole payload), so a replica's log is byte-identical.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import NamedTuple

RECORD_TAG = 0x01
LOG_TAG = 0x01
FLAG_CHUNKED = 0x01
#: The key has a deadline in the ``expiry`` sub-database (format >= 7).
FLAG_EXPIRES = 0x02
OP_SET = 1
OP_DELETE = 2
#: A replicated document (`store/docs.py`), format >= 3.
OP_DOC = 3
#: A set with a deadline: value = deadline (u64 µs) ++ value (format >= 7).
OP_SET_EXPIRING = 4
#: A delete that is an expiry, logged by the root only (format >= 7).
OP_EXPIRE = 5
#: Every op code a log entry may hold.
LOG_OPS = (OP_SET, OP_DELETE, OP_DOC, OP_SET_EXPIRING, OP_EXPIRE)
#: The deadline prefix of an op-4 entry's value.
DEADLINE = struct.Struct("<Q")
#: One LMDB page (4096) minus its 16-byte header: a chunk fills exactly one overflow page.
CHUNK_SIZE = 4080
HASH_SIZE = 32
ZERO_HASH = b"\x00" * HASH_SIZE
#: The chain hashes (codes the codec takes; a store records the name, `store/chainhash.py`).
CHAIN_BLAKE2B = 1
CHAIN_SHA256 = 2
CHAINS = (CHAIN_BLAKE2B, CHAIN_SHA256)
MAX_KEY = 500
MAX_OWNER = 255
#: Largest value accepted by `Store.apply` (25 MiB).
MAX_VALUE = 25 << 20
#: Largest key a log entry can carry (its u16 length field).
MAX_ENTRY_KEY = 65535

RECORD_HEADER = struct.Struct("<BBQII")  # tag, flags, seq, vlen, crc
RECORD_FIXED = RECORD_HEADER.size + 1  # + owner length byte = 19
ENTRY_HEADER = struct.Struct("<QBBHI")  # seq, op, owner len, key len, value len
ENTRY_FIXED = ENTRY_HEADER.size  # 16
LOG_HEADER = struct.Struct("<BBQIQ32sII")  # tag, flags, first, count, time, head, plen, crc
#: The largest log record (header + compressed payload) a node writes. Replication ships a
#: record as one frame of at most 256 MiB and a replica refuses a bigger one for ever, so
#: the store refuses to write one (and the gateway never builds a batch that could be).
MAX_LOG_RECORD = 240 << 20
#: The largest uncompressed entry payload whose snappy form surely fits `MAX_LOG_RECORD`:
#: snappy's worst case is 32 + n + n / 6 bytes.
MAX_LOG_PAYLOAD = (MAX_LOG_RECORD - LOG_HEADER.size - 32) * 6 // 7


def entry_size(owner_len: int, key_len: int, value_len: int) -> int:
    """Bytes of one log entry in a batch payload (before compression)."""
    return ENTRY_HEADER.size + owner_len + key_len + value_len


_PREFIX = struct.Struct("<BBQI")


class RecordHeader(NamedTuple):
    """Decoded fixed part of a value record."""

    flags: int
    seq: int
    vlen: int
    crc: int
    owner: str
    #: Offset of the inline value in the record (meaningless when chunked).
    value_offset: int

    @property
    def owner_len(self) -> int:
        """Length in bytes of the stored owner (as written, whatever its UTF-8)."""
        return self.value_offset - RECORD_FIXED


class Entry(NamedTuple):
    """One logged change."""

    seq: int
    op: int
    owner: str
    key: bytes
    value: bytes


class LogHeader(NamedTuple):
    """Decoded fixed part of a log record."""

    flags: int
    first_seq: int
    num_entries: int
    time_us: int
    hash_head: bytes
    plen: int
    crc: int


def record_crc(key: bytes, head14: bytes, tail: bytes, value: bytes) -> int:
    """CRC of a record: the user key it is stored under (a flipped key byte must not
    pass), its first 14 bytes, everything after the CRC field, then the value."""
    return zlib.crc32(value, zlib.crc32(tail, zlib.crc32(head14, zlib.crc32(key))))


def encode_record(
    key: bytes, seq: int, owner: bytes, value: bytes, chunked: bool, expires: bool = False
) -> bytes:
    """Encode the value record of `key`; when `chunked`, the value is left out (it goes to
    chunks); `expires` sets `FLAG_EXPIRES`. The key itself is not stored in the record,
    only covered by its CRC."""
    flags = (FLAG_CHUNKED if chunked else 0) | (FLAG_EXPIRES if expires else 0)
    head14 = _PREFIX.pack(RECORD_TAG, flags, seq, len(value))
    tail = bytes((len(owner),)) + owner
    crc = record_crc(key, head14, tail, value)
    out = head14 + struct.pack("<I", crc) + tail
    return out if chunked else out + value


def decode_record_header(rec: bytes) -> RecordHeader:
    """Decode the fixed part of a record; raises ValueError on a malformed record."""
    if len(rec) < RECORD_FIXED or rec[0] != RECORD_TAG:
        raise ValueError("malformed value record")
    _tag, flags, seq, vlen, crc = RECORD_HEADER.unpack_from(rec, 0)
    n = rec[18]
    off = RECORD_FIXED + n
    if len(rec) < off or (not flags & FLAG_CHUNKED and len(rec) != off + vlen):
        raise ValueError("malformed value record")
    return RecordHeader(flags, seq, vlen, crc, bytes(rec[19:off]).decode("utf-8", "replace"), off)


def record_value(key: bytes, rec: bytes) -> bytes | None:
    """The inline value of `rec` (stored under `key`) after checking its CRC; None when
    the CRC fails.

    Raises ValueError for a chunked or malformed record.
    """
    h = decode_record_header(rec)
    if h.flags & FLAG_CHUNKED:
        raise ValueError("record is chunked")
    value = rec[h.value_offset :]
    if record_crc(key, rec[:14], rec[18 : h.value_offset], value) != h.crc:
        return None
    return bytes(value)


def check_chunked_record(key: bytes, rec: bytes, value: bytes) -> bool:
    """True when the CRC of chunked record `rec` (under `key`) matches the reassembled
    `value`."""
    h = decode_record_header(rec)
    crc = record_crc(key, rec[:14], rec[18 : h.value_offset], value)
    return crc == h.crc and len(value) == h.vlen


def encode_entry(seq: int, op: int, owner: bytes, key: bytes, value: bytes) -> bytes:
    """Encode one log entry."""
    return ENTRY_HEADER.pack(seq, op, len(owner), len(key), len(value)) + owner + key + value


def expiring_value(deadline_us: int, value: bytes) -> bytes:
    """The value field of an op-4 entry: the deadline, then the value."""
    return DEADLINE.pack(deadline_us) + value


def split_expiring(field: bytes) -> tuple[int, bytes]:
    """(deadline µs, value) of an op-4 entry's value field; ValueError when too short."""
    if len(field) < DEADLINE.size:
        raise ValueError("op-4 entry shorter than its deadline")
    return DEADLINE.unpack_from(field, 0)[0], bytes(field[DEADLINE.size :])


def chain(prev: bytes, entry: bytes | memoryview, alg: int = CHAIN_BLAKE2B) -> bytes:
    """One link of the hash chain: H(prev ++ entry), H the chain hash `alg`."""
    if alg == CHAIN_SHA256:
        s = hashlib.sha256(prev)
        s.update(entry)
        return s.digest()
    if alg == CHAIN_BLAKE2B:
        b = hashlib.blake2b(prev, digest_size=HASH_SIZE)
        b.update(entry)
        return b.digest()
    raise ValueError(f"unknown chain hash {alg}")


def pack_entries(
    first_seq: int,
    ops: list[tuple[int, bytes, bytes, bytes]],
    prev_hash: bytes,
    alg: int = CHAIN_BLAKE2B,
) -> tuple[bytes, bytes]:
    """Encode ops ``(op, owner, key, value)`` as consecutive entries from `first_seq`.

    Returns the uncompressed payload and the hash head (chain hash `alg`) after the last
    entry.
    """
    if alg not in CHAINS:
        raise ValueError(f"unknown chain hash {alg}")
    parts: list[bytes] = []
    h = prev_hash
    seq = first_seq
    for op, owner, key, value in ops:
        e = encode_entry(seq, op, owner, key, value)
        h = chain(h, e, alg)
        parts.append(e)
        seq += 1
    return b"".join(parts), h


def unpack_entries(
    payload: bytes, prev_hash: bytes, alg: int = CHAIN_BLAKE2B
) -> tuple[list[Entry], bytes]:
    """Decode a batch payload and recompute the chain (hash `alg`) from `prev_hash`.

    Returns the entries and the hash head. Raises ValueError on malformed bytes.
    """
    if alg not in CHAINS:
        raise ValueError(f"unknown chain hash {alg}")
    return _entries(payload, prev_hash, alg)


def decode_entries(payload: bytes) -> list[Entry]:
    """Decode a batch payload without the chain: for readers of a log whose chain was
    checked when it was written or applied (a watch stream). Raises ValueError on
    malformed bytes, as `unpack_entries` does."""
    return _entries(payload, None, 0)[0]


def _entries(payload: bytes, prev_hash: bytes | None, alg: int) -> tuple[list[Entry], bytes]:
    # `prev_hash` None: decode only (the head returned is empty).
    out: list[Entry] = []
    h = prev_hash
    pos = 0
    n = len(payload)
    hs = ENTRY_HEADER.size
    while pos < n:
        if pos + hs > n:
            raise ValueError("truncated log entry header")
        seq, op, on, kn, vn = ENTRY_HEADER.unpack_from(payload, pos)
        end = pos + hs + on + kn + vn
        if end > n or op not in LOG_OPS:
            raise ValueError("malformed log entry")
        a = pos + hs
        owner = bytes(payload[a : a + on]).decode("utf-8", "replace")
        key = bytes(payload[a + on : a + on + kn])
        value = bytes(payload[a + on + kn : end])
        if h is not None:
            h = chain(h, payload[pos:end], alg)
        out.append(Entry(seq, op, owner, key, value))
        pos = end
    return out, h or b""


def encode_log_header(
    flags: int, first_seq: int, num_entries: int, time_us: int, hash_head: bytes, payload: bytes
) -> bytes:
    """Encode a log record's header; the CRC covers the header and the whole payload."""
    fields = (LOG_TAG, flags, first_seq, num_entries, time_us, hash_head, len(payload), 0)
    head58 = LOG_HEADER.pack(*fields)[:58]
    crc = zlib.crc32(payload, zlib.crc32(head58))
    return head58 + struct.pack("<I", crc)


def decode_log_header(rec: bytes) -> LogHeader:
    """Decode a log record's header (62 bytes); raises ValueError when malformed."""
    if len(rec) < LOG_HEADER.size or rec[0] != LOG_TAG:
        raise ValueError("malformed log record")
    _t, flags, first, count, time_us, head, plen, crc = LOG_HEADER.unpack_from(rec, 0)
    return LogHeader(flags, first, count, time_us, bytes(head), plen, crc)


def log_crc_ok(header: bytes, payload: bytes) -> bool:
    """True when a log record's CRC matches its header and payload."""
    h = decode_log_header(header)
    return zlib.crc32(payload, zlib.crc32(header[:58])) == h.crc and len(payload) == h.plen
