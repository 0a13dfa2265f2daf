"""How the SDK's values travel over HTTP (pure, no I/O): key paths, batch bodies, range
items, watch events, and the plan that cuts a large batch into admissible requests.

Keys and values are bytes on the wire's terms: text members (``key``, ``value``) when they
are valid UTF-8, base64 members (``key_b64``, ``value_b64``) otherwise.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import quote

#: Ops and key + value bytes per `POST /v1/batch` the client sends unless told otherwise:
#: the gateway's default per-request limit of ops (a request that fills a root batch commits
#: without waiting for the batch window), and bytes well under its 100 MiB bodies.
DEFAULT_BATCH_OPS = 10_000
DEFAULT_BATCH_BYTES = 8 << 20

#: A key: text (sent as UTF-8) or any bytes.
Key = str | bytes


class Item(NamedTuple):
    """One key of a range read; `value` is None for a keys-only read."""

    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Change:
    """One change of a watch stream: `op` is "set" or "delete" (value None)."""

    seq: int
    op: str
    key: bytes
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Versioned:
    """A value with the seq of the key's last change (for `put(..., if_seq=seq)`)."""

    value: bytes
    seq: int


@dataclass(frozen=True, slots=True)
class WriteResult:
    """Answer of one PUT or DELETE: the log `seq` and "written" / "duplicate" / "deleted" /
    "absent"; `replayed` when the node answered a retry with the first answer."""

    seq: int
    status: str
    replayed: bool = False


@dataclass(slots=True)
class BatchResult:
    """Totals of a batch over every request it took (`requests`; `replayed` of them were
    answered from an earlier try); `seq` is the highest log seq touched."""

    seq: int = 0
    written: int = 0
    deleted: int = 0
    duplicates: int = 0
    absent: int = 0
    #: sets replaced by a later set of the same key in the same batch (stored, never served)
    superseded: int = 0
    #: ops whose `if_seq` / `if_absent` condition failed at commit (nothing written for them)
    precondition_failed: int = 0
    requests: int = 0
    replayed: int = 0

    def add(self, doc: dict[str, Any], replayed: bool) -> None:
        """Count one request's answer (`{"seq", "written", "deleted", ...}`)."""
        self.seq = max(self.seq, int(doc.get("seq") or 0))
        self.written += int(doc.get("written") or 0)
        self.deleted += int(doc.get("deleted") or 0)
        self.duplicates += int(doc.get("duplicates") or 0)
        self.absent += int(doc.get("absent") or 0)
        self.superseded += int(doc.get("superseded") or 0)
        self.precondition_failed += int(doc.get("precondition_failed") or 0)
        self.requests += 1
        self.replayed += int(replayed)


def as_bytes(x: str | bytes) -> bytes:
    """Text as UTF-8; bytes (or a bytearray, a memoryview) as they are. Anything else is a
    TypeError: ``bytes(3)`` is three zero bytes, so an int would be stored as garbage."""
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    raise TypeError(f"keys and values are str or bytes, not {type(x).__name__}")


def kv_path(key: Key) -> str:
    """``/v1/kv/{key}`` with every byte of the key percent-encoded except unreserved ones
    (so ``/``, ``?``, ``%`` and non-UTF-8 bytes arrive as sent), and the dots of the keys
    ``.`` and ``..`` too."""
    k = as_bytes(key)
    if not k:
        raise ValueError("a key is 1 to 500 bytes")
    return "/v1/kv/" + segment(k)


def segment(raw: Key) -> str:
    """`raw` as one path segment: every byte percent-encoded but unreserved ones, and the
    dots of ``.`` and ``..``: a dot segment is removed from a path by HTTP clients (RFC 3986
    5.2.4), so the key ``..`` would ask for ``/v1`` and its 404 read as an absent key."""
    b = as_bytes(raw)
    return "%2E" * len(b) if b in (b".", b"..") else quote(b, safe="")


def put_bytes(doc: dict[str, Any], name: str, raw: bytes) -> None:
    """``doc[name]`` as text, or ``doc[name + "_b64"]`` when `raw` is not UTF-8."""
    try:
        doc[name] = raw.decode()
    except UnicodeDecodeError:
        doc[name + "_b64"] = base64.b64encode(raw).decode()


def get_bytes(doc: dict[str, Any], name: str) -> bytes | None:
    """``doc[name]`` (text) or ``doc[name + "_b64"]`` as bytes; None when neither."""
    if name in doc and doc[name] is not None:
        return str(doc[name]).encode()
    b64 = doc.get(name + "_b64")
    return base64.b64decode(b64) if b64 is not None else None


@dataclass(frozen=True, slots=True)
class WireOp:
    """A batch op as it will be sent, with its cost (key + value bytes, as the gateway
    counts it) known up front."""

    doc: dict[str, Any]
    cost: int


def encode_op(op: Sequence[Any]) -> WireOp:
    """A (kind, key[, value[, expiry]]) tuple as a batch body member. `expiry` (sets only):
    a ttl (``"90s"``, seconds, a timedelta) or an aware datetime (its ``expires_at``)."""
    if not op or op[0] not in ("set", "delete"):
        raise ValueError(f"a batch op is ('set', key, value) or ('delete', key), got {op!r}")
    kind = op[0]
    if len(op) < 2:
        raise ValueError(f"op {op!r} has no key")
    key = as_bytes(op[1])
    doc: dict[str, Any] = {"op": kind}
    put_bytes(doc, "key", key)
    cost = len(key)
    if kind == "set":
        if len(op) < 3 or op[2] is None:
            raise ValueError(f"a set op needs a value: {op!r}")
        value = as_bytes(op[2])
        put_bytes(doc, "value", value)
        cost += len(value)
        if len(op) > 3 and op[3] is not None:
            expiry = op[3]
            if isinstance(expiry, datetime):
                if expiry.tzinfo is None:
                    raise ValueError(f"an expires_at needs a timezone: {op!r}")
                doc["expires_at"] = expiry.isoformat()
            elif isinstance(expiry, timedelta):
                doc["ttl"] = expiry.total_seconds()
            else:
                doc["ttl"] = expiry
    return WireOp(doc, cost)


def split(ops: Sequence[WireOp], max_ops: int, max_bytes: int) -> list[tuple[int, int]]:
    """Cut `ops` into consecutive pieces ``[start, stop)`` of at most `max_ops` ops and
    `max_bytes` cost each, in order. An op costlier than `max_bytes` alone makes a piece of
    its own (the node then says whether it is admissible at all)."""
    if max_ops < 1 or max_bytes < 1:
        raise ValueError("max_ops and max_bytes must be at least 1")
    pieces: list[tuple[int, int]] = []
    start, cost = 0, 0
    for i, op in enumerate(ops):
        n = i - start
        if n and (n >= max_ops or cost + op.cost > max_bytes):
            pieces.append((start, i))
            start, cost = i, 0
        cost += op.cost
    if start < len(ops):
        pieces.append((start, len(ops)))
    return pieces


@dataclass(slots=True)
class BatchPlan:
    """The requests of one logical batch, re-planned when the node answers 413.

    Each piece's Idempotency-Key is ``<base>:<start>+<count>``: a retry of a piece sends
    the same key with the same body, and a piece cut differently after a 413 (a different
    body) gets a different key, so a key is never reused for another request.
    """

    ops: list[WireOp]
    base_key: str
    max_ops: int = DEFAULT_BATCH_OPS
    max_bytes: int = DEFAULT_BATCH_BYTES
    pending: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pending = split(self.ops, self.max_ops, self.max_bytes)[::-1]

    def next(self) -> tuple[int, int] | None:
        """The next piece to send (None when every piece was acknowledged)."""
        return self.pending[-1] if self.pending else None

    def body(self, piece: tuple[int, int]) -> dict[str, Any]:
        return {"ops": [op.doc for op in self.ops[piece[0] : piece[1]]]}

    def key(self, piece: tuple[int, int]) -> str:
        return f"{self.base_key}:{piece[0]}+{piece[1] - piece[0]}"

    def done(self) -> None:
        """The next piece was acknowledged."""
        self.pending.pop()

    def too_large(self, max_ops: int | None, max_bytes: int | None) -> bool:
        """The next piece got 413: cut it (and every later piece) to the node's limits, or
        in half when the node gave none. False when it cannot be cut any smaller."""
        start, stop = self.pending[-1]
        if max_ops is None and max_bytes is None:
            if stop - start <= 1:
                return False
            max_ops = (stop - start) // 2
        if max_ops is not None:
            self.max_ops = max(1, min(self.max_ops, max_ops))
        if max_bytes is not None:
            self.max_bytes = max(1, min(self.max_bytes, max_bytes))
        rest = split(self.ops[start:], self.max_ops, self.max_bytes)
        replanned = [(a + start, b + start) for a, b in rest]
        if replanned[0] == (start, stop):
            return False
        self.pending = replanned[::-1]
        return True


def range_query(
    prefix: Key | None,
    start: Key | None,
    end: Key | None,
    *,
    keys_only: bool = False,
    limit: int | None = None,
    cursor: str | None = None,
) -> str:
    """The query string of ``GET /v1/range``: every bound percent-encoded byte by byte, so
    any key (also non-UTF-8) round-trips."""
    if prefix is not None and (start is not None or end is not None):
        raise ValueError("give either prefix or start/end, not both")
    parts: list[str] = []
    for name, v in (("prefix", prefix), ("start", start), ("end", end)):
        if v is not None and (v or name != "prefix"):  # an empty prefix: every key
            parts.append(f"{name}={quote(as_bytes(v), safe='')}")
    if keys_only:
        parts.append("keys_only=true")
    if limit is not None:
        parts.append(f"limit={int(limit)}")
    if cursor is not None:
        parts.append(f"cursor={quote(cursor, safe='')}")
    return "&".join(parts)


def item(doc: dict[str, Any]) -> Item:
    """A range item from its JSON form."""
    key = get_bytes(doc, "key")
    if key is None:
        raise ValueError(f"range item without a key: {doc!r}")
    return Item(key, get_bytes(doc, "value"))


def change(doc: dict[str, Any]) -> Change | None:
    """A watch line as a Change; None for a heartbeat (a line without an op)."""
    op = doc.get("op")
    if op is None:
        return None
    key = get_bytes(doc, "key")
    if key is None or not isinstance(doc.get("seq"), int):
        raise ValueError(f"watch change without key or seq: {doc!r}")
    return Change(int(doc["seq"]), str(op), key, get_bytes(doc, "value") if op == "set" else None)


def heartbeat_seq(doc: dict[str, Any]) -> int | None:
    """The seq of a heartbeat line ("every change up to seq was sent"), else None."""
    if doc.get("heartbeat") and isinstance(doc.get("seq"), int):
        return int(doc["seq"])
    return None


class Resume:
    """Where a dropped watch resumes: from the last seq seen, skipping the changes of
    that seq already delivered (one log seq can carry many changes, sent in order), or
    after the last heartbeat's seq when that is later. `from_seq` None: "from now" (the
    node's position when the first stream opens, which its first heartbeat names)."""

    def __init__(self, from_seq: int | None) -> None:
        self.from_seq = from_seq
        self._seq = -1
        #: Changes of seq `_seq` delivered so far, over every connection: a reconnection
        #: that failed before redelivering them must not forget them.
        self._delivered = 0
        #: Of those, how many the current connection has yet to redeliver.
        self._skip = 0

    def restart(self) -> int | None:
        """The `from_seq` to ask for on (re)connecting (None: from now)."""
        if self._seq >= 0:
            self._skip = self._delivered
            return self._seq
        return self.from_seq

    def fresh(self, c: Change) -> bool:
        """Whether `c` is new (False for a change redelivered after a resume)."""
        if c.seq != self._seq:
            self._seq, self._delivered, self._skip = c.seq, 0, 0
        if self._skip:
            self._skip -= 1
            return False
        self._delivered += 1
        return True

    def complete_through(self) -> int:
        """The highest seq whose changes were all delivered (-1 before anything is known)."""
        if self._seq >= 0:
            return self._seq - 1
        return -1 if self.from_seq is None else self.from_seq - 1

    def heartbeat(self, seq: int) -> None:
        """Every change up to `seq` was sent: a reconnection asks for what follows it (so
        a watch "from now" dropped before its first change resumes without a gap)."""
        if seq < self._seq:
            return
        self._seq, self._delivered, self._skip = -1, 0, 0
        if self.from_seq is None or seq + 1 > self.from_seq:
            self.from_seq = seq + 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Every key under a prefix as it was at log seq `seq`, in key order (`items`: read
    it before asking the client for anything else; a watch from ``seq + 1`` goes on from
    exactly there)."""

    seq: int
    items: Iterator[Item]


class Overlay:
    """The changes of a prefix up to seq `upto`, folded to the last one per key: laid over
    a range read whose pages were taken at seqs between the start of the watch and `upto`,
    it gives the prefix exactly as it was at `upto` (a key no change touched had the same
    value all along; any other ends as its last change left it)."""

    def __init__(self, upto: int) -> None:
        self.upto = upto
        self.last: dict[bytes, bytes | None] = {}

    def add(self, c: Change) -> None:
        """Fold one change (changes after `upto` are not part of the picture)."""
        if c.seq <= self.upto:
            self.last[c.key] = c.value if c.op == "set" else None

    def merge(self, items: Iterator[Item]) -> Iterator[Item]:
        """`items` (in key order) with the folded changes applied, in key order."""
        pending = sorted(self.last.items())
        i = 0
        for it in items:
            while i < len(pending) and pending[i][0] < it.key:
                k, v = pending[i]
                i += 1
                if v is not None:
                    yield Item(k, v)
            if i < len(pending) and pending[i][0] == it.key:
                k, v = pending[i]
                i += 1
                if v is not None:
                    yield Item(k, v)
                continue
            yield it
        for k, v in pending[i:]:
            if v is not None:
                yield Item(k, v)


#: Range reads `snapshot` starts again when the watch over them finds its start collected.
SNAPSHOT_TRIES = 3
#: Bytes of a snapshot's pages held in memory before they spill to a temporary file.
SPOOL_MEMORY = 8 << 20

_ITEM_HEAD = struct.Struct(">II")


def pack_item(it: Item) -> bytes:
    """One range item as spool bytes (key and value lengths, then both)."""
    value = it.value or b""
    return _ITEM_HEAD.pack(len(it.key), len(value)) + it.key + value


def unpack_items(f: BinaryIO) -> Iterator[Item]:
    """The items `pack_item` wrote to `f`, in order; `f` is closed at the end."""
    with f:
        while head := f.read(_ITEM_HEAD.size):
            klen, vlen = _ITEM_HEAD.unpack(head)
            key = f.read(klen)
            yield Item(key, f.read(vlen))


NDJSON = "application/x-ndjson"
