"""A replica's per-entry work on a log record, pure-Python reference (Cython twin in
`_codec.pyx`; `tests/property/test_replay_agree.py` proves them equal).

Two passes over a record's decompressed payload, neither building an `Entry` per change:

- `scan_entries` holds the rules every entry of a received record must meet, and is
  their one home: the compiled twin mirrors them, and a replica's store applies nothing
  that has not passed them (`replica_apply`, which names a refused record's seq in an
  `InvalidRecordError`). Every entry is numbered from the record's first seq, has a known
  op, a key of 1..MAX_KEY bytes (an op-3 document name too), a value of at most MAX_VALUE
  bytes (an op-4 set: its 8-byte deadline and then such a value) and none for a delete or
  an expiry, lies inside the payload, and there are as many as the
  header says; each is folded into the hash chain. It needs nothing but the bytes (the
  Cython twin runs it without the GIL on large records).
- `apply_entries` then applies them inside the caller's write transaction through the
  bound ``get``/``put``/``delete`` of the data sub-database, a `Rare` for chunked values
  (handed a zero-copy view of the value inside the payload) and ``doc(seq, key, value)``
  for op-3 entries, and adds each owner's usage changes to `delta`.

Scanning first keeps the all-or-nothing rule simple: nothing is applied from a record
whose bytes or chain do not hold.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from store import format as fmt
from store.applyloop import Rare, count_expiry, forget
from store.usage import stored_bytes

_HDR = fmt.ENTRY_HEADER


def check_entry(seq: int, op: int, kn: int, vn: int) -> None:
    """The rules one entry's fixed fields must meet (module doc); ValueError naming the
    first one it breaks. Filtered records' kept entries meet the same (`store/filtered.py`)."""
    if op not in fmt.LOG_OPS:
        raise ValueError(f"entry at seq {seq} has unknown op code {op}")
    if not 1 <= kn <= fmt.MAX_KEY:
        raise ValueError(f"entry at seq {seq} has a key of {kn} bytes (1..{fmt.MAX_KEY})")
    if op == fmt.OP_SET_EXPIRING:  # the deadline, then the value
        bad = vn < fmt.DEADLINE.size or vn - fmt.DEADLINE.size > fmt.MAX_VALUE
    else:
        bad = vn > fmt.MAX_VALUE or ((op == fmt.OP_DELETE or op == fmt.OP_EXPIRE) and vn > 0)
    if bad:
        raise ValueError(f"entry at seq {seq} has a value of {vn} bytes")


def scan_entries(
    raw: Any, prev_hash: bytes, first_seq: int, num_entries: int, alg: int = fmt.CHAIN_BLAKE2B
) -> bytes:
    """Check the entries of `raw` (see module doc); return the hash head (chain hash `alg`)
    after the last.

    Raises ValueError naming the first entry no store accepts (the caller names the
    record)."""
    if len(prev_hash) != fmt.HASH_SIZE:
        raise ValueError("prev_hash must be 32 bytes")
    if alg not in fmt.CHAINS:
        raise ValueError(f"unknown chain hash {alg}")
    mv = memoryview(raw)
    h = prev_hash
    pos, n, hs = 0, len(mv), _HDR.size
    count = 0
    while pos < n:
        if pos + hs > n:
            raise ValueError("truncated entry header")
        seq, op, on, kn, vn = _HDR.unpack_from(mv, pos)
        if seq != first_seq + count:
            raise ValueError(f"entry {count} has seq {seq}, expected {first_seq + count}")
        check_entry(seq, op, kn, vn)
        end = pos + hs + on + kn + vn
        if end > n:
            raise ValueError(f"entry at seq {seq} runs past the payload")
        h = fmt.chain(h, mv[pos:end], alg)
        pos = end
        count += 1
    if count != num_entries:
        raise ValueError(f"{count} entries, the header says {num_entries}")
    return h


def apply_entries(
    raw: Any,
    get: Callable[..., Any],
    put: Callable[..., Any],
    delete: Callable[..., Any],
    rare: Rare,
    doc: Callable[[int, bytes, bytes], None],
    delta: dict[str, list[int]],
    max_key: bytes | None = None,
    append: Callable[..., Any] | None = None,
) -> bytes | None:
    """Apply the entries of `raw`, which `scan_entries` accepted (see module doc).

    As in the root's `applyloop.apply_ops`: `max_key` is the data sub-database's largest
    key (None: empty or unknown) and `append` a `Cursor.put`-like callable; a set of a
    greater key overwrites nothing, so it skips the lookup and is stored in LMDB's append
    mode (``append(key, value, True, True, True)``). Returns the largest key after the
    record (to pass to the next record of the same transaction)."""
    mv = memoryview(raw)
    pos, n, hs = 0, len(mv), _HDR.size
    while pos < n:
        if pos + hs > n:  # `scan_entries` accepted these bytes; still never read past them
            raise ValueError("entry runs past the payload")
        seq, op, on, kn, vn = _HDR.unpack_from(mv, pos)
        a = pos + hs
        k = a + on
        v = k + kn
        pos = v + vn
        if pos > n:
            raise ValueError("entry runs past the payload")
        key = bytes(mv[k:v])
        if op == fmt.OP_DOC:  # a replicated document, never a user key
            doc(seq, key, bytes(mv[v:pos]))
            continue
        is_set = op == fmt.OP_SET or op == fmt.OP_SET_EXPIRING
        fresh = append is not None and is_set and (max_key is None or key > max_key)
        old = None if fresh else get(key)
        if old is not None:
            forget(fmt.decode_record_header(old), kn, delta, rare, key)
        owner = bytes(mv[a:k])
        name = owner.decode("utf-8", "replace")
        d = delta.get(name)
        if d is None:
            d = delta[name] = [0, 0, 0, 0, 0, 0]
        if is_set:
            dl = 0
            if op == fmt.OP_SET_EXPIRING:
                dl = fmt.DEADLINE.unpack_from(mv, v)[0]
                v += fmt.DEADLINE.size
            vlen = pos - v
            big = vlen > fmt.CHUNK_SIZE
            if big:
                rare.put_chunks(seq, mv[v:pos])  # LMDB copies it: no value bytes object
            rec = fmt.encode_record(key, seq, owner, bytes(mv[v:pos]), big, dl != 0)
            if fresh and append is not None:
                append(key, rec, True, True, True)
                max_key = key
            else:
                put(key, rec)
            if dl:
                rare.set_deadline(key, dl)
            d[0] += 1
            d[1] += stored_bytes(kn, vlen, on)
            d[2] += 1
        else:
            delete(key)
            if op == fmt.OP_DELETE:
                d[3] += 1
            else:  # an expiry: not a producer's delete
                count_expiry(d)
    return max_key
