"""Replication wire format — this docstring is the byte-level spec.

A replication connection is a TCP stream of frames. All integers are little-endian; CRC is
CRC-32 (zlib polynomial). Golden frames in ``tests/data/repl_*.bin`` fail the suite if these
bytes drift without a bump of `PROTOCOL_VERSION`.

Frame::

    off  size  field
    0    1     type (below)
    1    1     flags: 0, except WELCOME's bit 0 (below)
    2    4     body length L (u32; at most MAX_BODY_OF[type], checked before the body is read)
    6    4     CRC-32 over bytes [0:6] ++ body
    10   L     body

Every type has its own body bound (`MAX_BODY_OF`): HELLO, WELCOME, HEARTBEAT, SNAPSHOT,
WAIT and END are fixed-size, REFUSE carries a short message, only RECORD may be large (one
stored log record, up to MAX_BODY). A receiver rejects a header claiming more before reading
a byte of the body, so a peer cannot make it buffer 256 MiB with a forged HELLO.

Every frame carries its own CRC so a corrupted, truncated or spliced stream is detected at
the first bad frame (the receiver drops the connection and resumes from its last applied
seq). A log record inside a RECORD frame also keeps its own CRC and hash head.

Bodies by type:

- ``HELLO`` (1, replica -> source), 92 bytes::

      0   2   protocol version (u16)
      2   1   mode: 1 = stream the log, 2 = fetch a snapshot (bootstrap)
      3   1   options: bit 0 = newest-only (start at the source's head, skip history);
                  bit 1 = upstream-capable (this client may send UPSTREAM frames);
                  bit 2 = a root candidate's standby (a leader streams it records that
                  its standbys have not confirmed yet; other replicas wait for them);
                  bit 3 = term-aware (the client wants the source's term in WELCOME);
                  bit 4 = head-aware (the client wants hash heads in HEARTBEAT frames);
                  bit 5 = keyspace-filtered (a KEYSPACES frame follows this HELLO)
      4   16  client id (random per process; equal to the source's id = itself)
      20  16  db id (all zero = unknown, allowed only with mode 2)
      36  8   last applied seq (the stream starts at last + 1)
      44  8   stop seq (0 = none: the source ends the stream after the record holding it)
      52  8   snapshot bytes already held (mode 2; 0 = start from byte 0)
      60  32  SHA-256 of the snapshot being resumed (all zero = none)

- ``WELCOME`` (2, source -> replica), 54 bytes: protocol version (u16), the source's own
  id (16), db id (16), source head seq (u64), first retained seq (u64), heartbeat interval
  in ms (u32). Records (mode 1) or a snapshot offer (mode 2) follow. Header flag bit 0
  (`WELCOME_UPSTREAM`), set only in answer to an upstream-capable HELLO in mode 1: the
  source reads UPSTREAM frames on this connection. A client sends UPSTREAM frames only
  after a WELCOME with that bit, so an older source (which ignores the option and sends
  flags 0) never receives one; an older client never sets the option. Answering a
  term-aware HELLO (option bit 3), the body is 62 bytes: the 54 above, then the leadership
  term recorded in the source's store (u64; 0 = none). A replica that has seen a newer term
  refuses the source (a deposed leader, or a node still following one); an older source
  ignores the option and sends 54 bytes, and an older client never asks.
- ``REFUSE`` (3), 2 + n bytes: refusal code (u16), UTF-8 message. Codes: 1 db id
  mismatch, 2 replicating from itself, 3 history no longer retained (bootstrap needed),
  4 unsupported protocol or request, 5 source not ready, 6 the source stopped as diverged
  (it holds a history its own source abandoned; see `diverged_refusal`), 7 keyspaces not
  held (a filtered source asked for keys outside its prefixes). The source closes
  after it. An older client treats a code it does not know as a plain refusal (next source,
  backoff), so new codes need no negotiation.
- ``RECORD`` (4): one log record exactly as stored — the 62-byte header of
  `store/format.py` then the compressed payload. Records follow in seq order, each starting
  right after the previous one's last seq.
- ``HEARTBEAT`` (5), 28 bytes: root wall time in µs (u64), root seq at that time (u64),
  root heartbeat interval in ms (u32), then the last seq this source sent on THIS
  connection before the frame (u64). The first three are made by the root's source and
  relayed unchanged by every replica's source, so lag stays relative to the root at any
  depth; the last lets the replica detect a lost record at once (it holds less than was
  sent) instead of waiting for the next record. Answering a head-aware HELLO (option bit
  4), the body is 60 bytes: the 28 above, then the root's hash head at the root seq (32;
  all zero = not known, e.g. relayed from an older source), made and relayed with the
  root's seq, so a replica holding that seq compares it with its own head there and stops
  as diverged when they differ. An older source ignores the option and sends 28 bytes; an
  older client never asks (its decoder, and its header bound, would reject 60).
- ``SNAPSHOT`` (6), 104 bytes: snapshot seq (u64), hash head (32), db id (16), size (u64),
  SHA-256 (32), offset where the data starts (u64). Right after this frame, the raw bytes
  [offset, size) of the snapshot file follow UNFRAMED (sendfile; verified by SHA-256 of the
  whole file), then the connection is closed.
- ``WAIT`` (7), 4 bytes: position in the bootstrap queue (u32); the source bounds
  concurrent bootstraps and tells waiting replicas their turn.
- ``END`` (8), 8 bytes: last seq sent (u64); the stop seq was reached, the source closes.
- ``INVALIDATE`` (10), ``FETCH`` (11) and ``FETCHED`` (12): a cache node's connection
  (HELLO mode 3); their bodies are `replicator/invalidation.py`'s. Mode 3 streams, instead
  of RECORD frames, one INVALIDATE per log record (its last seq and the keys it changed,
  no values) and answers FETCH frames (a cache's misses) with FETCHED. Only a mode-3 HELLO
  gets them; an older source refuses mode 3 (code 4).
- ``KEYSPACES`` (13, replica -> source, right after a HELLO with option bit 5), at most
  `MAX_KEYSPACES_BODY` bytes: the replica's hash head at its last applied seq (32), the
  number of prefixes (u16, 1..`MAX_KEYSPACES`), then each prefix as its length (u16,
  1..500) and its bytes. The source streams the log filtered to keys under those prefixes
  (`store/filtered.py`: RECORD frames then hold filtered records, flag bit 1 of the log
  header) starting its chain of skip hashes at that head, or refuses with code 7 when it
  does not hold them all (a filtered source holds only its own prefixes). A snapshot
  request (mode 2) sends it too: the source then sends a snapshot holding only those
  prefixes (`store/prune.py`), and a filtered source refuses a full replica either way.
- ``UPSTREAM`` (9, replica -> source, the only frame a client sends after HELLO), 2 + n
  bytes, n at most `MAX_UPSTREAM_PAYLOAD`: kind (u16), payload. The kinds and their
  payloads are `replicator/upstream.py`'s; a source ignores (and logs) a kind it does not
  know, so a newer replica can talk to an older source of the same protocol version.
"""

from __future__ import annotations

import re
import struct
import zlib
from typing import NamedTuple

PROTOCOL_VERSION = 1
HEADER = struct.Struct("<BBII")  # type, flags, body length, crc
HEADER_SIZE = HEADER.size  # 10
#: Largest frame body: a log record of the largest batch fits with room to spare.
MAX_BODY = 256 << 20

HELLO = 1
WELCOME = 2
REFUSE = 3
RECORD = 4
HEARTBEAT = 5
SNAPSHOT = 6
WAIT = 7
END = 8
UPSTREAM = 9
INVALIDATE = 10
FETCH = 11
FETCHED = 12
KEYSPACES = 13
TYPES = frozenset(
    {HELLO, WELCOME, REFUSE, RECORD, HEARTBEAT, SNAPSHOT, WAIT, END, UPSTREAM}
    | {INVALIDATE, FETCH, FETCHED, KEYSPACES}
)
#: Longest REFUSE message accepted (the source sends one line).
MAX_REFUSE_MESSAGE = 4096

MODE_STREAM = 1
MODE_SNAPSHOT = 2
#: A cache node: invalidations and miss answers instead of records (`invalidation.py`).
MODE_INVALIDATE = 3
OPT_NEWEST_ONLY = 0x01
OPT_UPSTREAM = 0x02
OPT_STANDBY = 0x04
OPT_TERM = 0x08
OPT_HEADS = 0x10
OPT_KEYSPACES = 0x20
#: WELCOME header flag: the source reads UPSTREAM frames on this connection.
WELCOME_UPSTREAM = 0x01
#: Largest UPSTREAM payload: senders split bigger summaries into several frames.
MAX_UPSTREAM_PAYLOAD = 1 << 20

REFUSE_DB_ID = 1
REFUSE_SELF = 2
REFUSE_BOOTSTRAP = 3
REFUSE_PROTOCOL = 4
REFUSE_NOT_READY = 5
REFUSE_DIVERGED = 6
REFUSE_KEYSPACE = 7

ZERO_ID = b"\x00" * 16
ZERO_SHA = b"\x00" * 32

_HELLO = struct.Struct("<HBB16s16sQQQ32s")
_WELCOME = struct.Struct("<H16s16sQQI")
_REFUSE = struct.Struct("<H")
_HEARTBEAT = struct.Struct("<QQIQ")
_HEAD = struct.Struct("32s")
_SNAPSHOT = struct.Struct("<Q32s16sQ32sQ")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U16 = struct.Struct("<H")
#: Most prefixes one filtered replica asks for, and the longest (a key's bound).
MAX_KEYSPACES = 64
MAX_PREFIX = 500
MAX_KEYSPACES_BODY = 32 + _U16.size + MAX_KEYSPACES * (_U16.size + MAX_PREFIX)

#: The largest body each frame type may claim (see the module docstring).
MAX_BODY_OF: dict[int, int] = {
    HELLO: _HELLO.size,
    WELCOME: _WELCOME.size + _U64.size,
    REFUSE: _REFUSE.size + MAX_REFUSE_MESSAGE,
    RECORD: MAX_BODY,
    HEARTBEAT: _HEARTBEAT.size + _HEAD.size,
    SNAPSHOT: _SNAPSHOT.size,
    WAIT: _U32.size,
    END: _U64.size,
    UPSTREAM: _U16.size + MAX_UPSTREAM_PAYLOAD,
    INVALIDATE: MAX_BODY,
    FETCH: 1 << 20,
    FETCHED: MAX_BODY,
    KEYSPACES: MAX_KEYSPACES_BODY,
}


class Hello(NamedTuple):
    """A replica's request."""

    version: int
    mode: int
    options: int
    client_id: bytes
    db_id: bytes
    last_seq: int
    stop_seq: int
    snapshot_offset: int
    snapshot_sha: bytes

    @property
    def newest_only(self) -> bool:
        """True when the replica wants only entries committed from now on."""
        return bool(self.options & OPT_NEWEST_ONLY)


class Welcome(NamedTuple):
    """The source's acceptance."""

    version: int
    source_id: bytes
    db_id: bytes
    head_seq: int
    first_seq: int
    heartbeat_ms: int
    #: The term recorded in the source's store; None when the source did not say (an older
    #: source, or a HELLO without `OPT_TERM`).
    term: int | None = None


class Refuse(NamedTuple):
    """The source's refusal."""

    code: int
    message: str


class Heartbeat(NamedTuple):
    """The root's clock, seq and hash head at one moment (+ what the sending source sent so
    far)."""

    time_us: int
    seq: int
    interval_ms: int
    sent_seq: int = 0
    #: The root's hash head at `seq`; None when not known (a 28-byte heartbeat).
    head: bytes | None = None


class SnapshotOffer(NamedTuple):
    """What snapshot follows and from which byte."""

    seq: int
    hash_head: bytes
    db_id: bytes
    size: int
    sha256: bytes
    offset: int


class FrameHeader(NamedTuple):
    """Decoded 10-byte frame header."""

    type: int
    flags: int
    length: int
    crc: int


def encode_frame(ftype: int, body: bytes, flags: int = 0) -> bytes:
    """One frame: header (with CRC over header prefix and body) then body."""
    prefix = HEADER.pack(ftype, flags, len(body), 0)[:6]
    crc = zlib.crc32(body, zlib.crc32(prefix))
    return prefix + _U32.pack(crc) + body


def decode_header(raw: bytes, allowed: frozenset[int] | None = None) -> FrameHeader:
    """Decode a frame header; raises ValueError on an unknown type, a type not in `allowed`
    (None: any) or a body longer than its type's bound (`MAX_BODY_OF`)."""
    ftype, flags, length, crc = HEADER.unpack(raw)
    if ftype not in TYPES:
        raise ValueError(f"unknown frame type {ftype}")
    if allowed is not None and ftype not in allowed:
        raise ValueError(f"unexpected frame type {ftype}")
    bound = MAX_BODY_OF[ftype]
    if length > bound:
        raise ValueError(f"frame of type {ftype}: body of {length} bytes exceeds {bound}")
    return FrameHeader(ftype, flags, length, crc)


def check_body(header: bytes, body: bytes) -> bool:
    """True when `body` matches the CRC in the 10-byte `header`."""
    crc: int = _U32.unpack_from(header, 6)[0]
    length: int = _U32.unpack_from(header, 2)[0]
    return zlib.crc32(body, zlib.crc32(header[:6])) == crc and len(body) == length


def encode_hello(h: Hello) -> bytes:
    """HELLO frame."""
    return encode_frame(HELLO, _HELLO.pack(*h))


def decode_hello(body: bytes) -> Hello:
    """Decode a HELLO body; ValueError when malformed."""
    if len(body) != _HELLO.size:
        raise ValueError("malformed HELLO")
    return Hello(*_HELLO.unpack(body))


def encode_welcome(w: Welcome, flags: int = 0) -> bytes:
    """WELCOME frame (`flags`: `WELCOME_UPSTREAM` or 0); the term only when `w` has one
    (answer a HELLO without `OPT_TERM` with none: an older client expects 54 bytes)."""
    body = _WELCOME.pack(*w[:6])
    if w.term is not None:
        body += _U64.pack(w.term)
    return encode_frame(WELCOME, body, flags)


def decode_welcome(body: bytes) -> Welcome:
    """Decode a WELCOME body, with or without the term; ValueError when malformed."""
    if len(body) == _WELCOME.size:
        return Welcome(*_WELCOME.unpack(body))
    if len(body) == _WELCOME.size + _U64.size:
        version, source_id, db_id, head_seq, first_seq, heartbeat_ms = _WELCOME.unpack_from(body)
        (term,) = _U64.unpack_from(body, _WELCOME.size)
        return Welcome(version, source_id, db_id, head_seq, first_seq, heartbeat_ms, term)
    raise ValueError("malformed WELCOME")


def encode_refuse(code: int, message: str) -> bytes:
    """REFUSE frame."""
    return encode_frame(REFUSE, _REFUSE.pack(code) + message.encode())


def decode_refuse(body: bytes) -> Refuse:
    """Decode a REFUSE body; ValueError when malformed."""
    if len(body) < _REFUSE.size:
        raise ValueError("malformed REFUSE")
    return Refuse(_REFUSE.unpack_from(body)[0], body[2:].decode("utf-8", "replace"))


#: How a `REFUSE_DIVERGED` message begins: the evidence, then why in words.
_DIVERGED = re.compile(r"abandoned history at seq (\d{1,20}) with hash head ([0-9a-f]{64}): ")


def diverged_refusal(seq: int, head: bytes, why: str) -> str:
    """The message of a `REFUSE_DIVERGED`: the source's hash head at `seq`, a point of the
    history its own source abandoned (a node holding the same head at that seq holds that
    history too), then `why` (cut to fit `MAX_REFUSE_MESSAGE`). Plain text, so an older
    client logs it as it is."""
    text = f"abandoned history at seq {seq} with hash head {head.hex()}: {why}"
    return text.encode()[:MAX_REFUSE_MESSAGE].decode("utf-8", "ignore")


def diverged_evidence(message: str) -> tuple[int, bytes] | None:
    """(seq, hash head) of a `diverged_refusal` message; None when it has none."""
    m = _DIVERGED.match(message)
    if m is None:
        return None
    return int(m.group(1)), bytes.fromhex(m.group(2))


def encode_record(header: bytes, payload: bytes) -> bytes:
    """RECORD frame holding one stored log record (header ++ payload)."""
    return encode_frame(RECORD, header + payload)


def encode_heartbeat(hb: Heartbeat, with_head: bool = False) -> bytes:
    """HEARTBEAT frame; 60 bytes with the head (all zero when `hb` has none) when
    `with_head` — only for a client that asked (`OPT_HEADS`): an older one rejects them."""
    body = _HEARTBEAT.pack(*hb[:4])
    if with_head:
        body += _HEAD.pack(hb.head or ZERO_SHA)
    return encode_frame(HEARTBEAT, body)


def decode_heartbeat(body: bytes) -> Heartbeat:
    """Decode a HEARTBEAT body, with or without the head; ValueError when malformed."""
    if len(body) == _HEARTBEAT.size:
        return Heartbeat(*_HEARTBEAT.unpack(body))
    if len(body) == _HEARTBEAT.size + _HEAD.size:
        (head,) = _HEAD.unpack_from(body, _HEARTBEAT.size)
        time_us, seq, interval_ms, sent_seq = _HEARTBEAT.unpack_from(body)
        return Heartbeat(time_us, seq, interval_ms, sent_seq, None if head == ZERO_SHA else head)
    raise ValueError("malformed HEARTBEAT")


def encode_snapshot(offer: SnapshotOffer) -> bytes:
    """SNAPSHOT frame (the raw file bytes follow it unframed)."""
    return encode_frame(SNAPSHOT, _SNAPSHOT.pack(*offer))


def decode_snapshot(body: bytes) -> SnapshotOffer:
    """Decode a SNAPSHOT body; ValueError when malformed."""
    if len(body) != _SNAPSHOT.size:
        raise ValueError("malformed SNAPSHOT")
    return SnapshotOffer(*_SNAPSHOT.unpack(body))


def encode_wait(position: int) -> bytes:
    """WAIT frame."""
    return encode_frame(WAIT, _U32.pack(position))


def decode_wait(body: bytes) -> int:
    """Decode a WAIT body; ValueError when malformed."""
    if len(body) != _U32.size:
        raise ValueError("malformed WAIT")
    return int(_U32.unpack(body)[0])


def encode_end(last_seq: int) -> bytes:
    """END frame."""
    return encode_frame(END, _U64.pack(last_seq))


def decode_end(body: bytes) -> int:
    """Decode an END body; ValueError when malformed."""
    if len(body) != _U64.size:
        raise ValueError("malformed END")
    return int(_U64.unpack(body)[0])


def encode_upstream(kind: int, payload: bytes) -> bytes:
    """UPSTREAM frame; ValueError when `payload` exceeds MAX_UPSTREAM_PAYLOAD."""
    if len(payload) > MAX_UPSTREAM_PAYLOAD:
        raise ValueError(f"upstream payload of {len(payload)} bytes exceeds {MAX_UPSTREAM_PAYLOAD}")
    return encode_frame(UPSTREAM, _U16.pack(kind) + payload)


def decode_upstream(body: bytes) -> tuple[int, bytes]:
    """Decode an UPSTREAM body as (kind, payload); ValueError when malformed."""
    if len(body) < _U16.size:
        raise ValueError("malformed UPSTREAM")
    return int(_U16.unpack_from(body)[0]), body[_U16.size :]


class Keyspaces(NamedTuple):
    """A filtered replica's request: its head and the prefixes it holds."""

    head: bytes
    prefixes: tuple[bytes, ...]


def encode_keyspaces(k: Keyspaces) -> bytes:
    """KEYSPACES frame."""
    if len(k.head) != 32 or not 1 <= len(k.prefixes) <= MAX_KEYSPACES:
        raise ValueError("a KEYSPACES frame holds a 32-byte head and 1..64 prefixes")
    parts = [k.head, _U16.pack(len(k.prefixes))]
    for p in k.prefixes:
        if not 1 <= len(p) <= MAX_PREFIX:
            raise ValueError(f"a prefix of {len(p)} bytes (1..{MAX_PREFIX})")
        parts += [_U16.pack(len(p)), p]
    return encode_frame(KEYSPACES, b"".join(parts))


def decode_keyspaces(body: bytes) -> Keyspaces:
    """Decode a KEYSPACES body; ValueError when malformed."""
    if len(body) < 34:
        raise ValueError("malformed KEYSPACES")
    head = body[:32]
    (n,) = _U16.unpack_from(body, 32)
    if not 1 <= n <= MAX_KEYSPACES:
        raise ValueError(f"KEYSPACES with {n} prefixes (1..{MAX_KEYSPACES})")
    pos, out = 34, []
    for _ in range(n):
        if pos + 2 > len(body):
            raise ValueError("malformed KEYSPACES")
        (ln,) = _U16.unpack_from(body, pos)
        pos += 2
        if not 1 <= ln <= MAX_PREFIX or pos + ln > len(body):
            raise ValueError("malformed KEYSPACES prefix")
        out.append(body[pos : pos + ln])
        pos += ln
    if pos != len(body):
        raise ValueError("malformed KEYSPACES: trailing bytes")
    return Keyspaces(head, tuple(out))
