"""Kyoto Tycoon's replication stream and update-log messages, pure parsing (no I/O).

A KT slave opens a connection to the master's port and sends ``B1 | flags u32 | ts u64 |
sid u16`` (big-endian); the master answers one byte ``B1`` (accepted; ``BF`` when it keeps
no update log) and then streams, forever:

- ``B1 | ts u64 | size u32 | message``: one update-log entry written at KT timestamp `ts`
  (size 0: a dummy the master sends after skipping many entries, so the slave's clock
  moves on);
- ``B0 | ts u64``: nothing new; the slave must answer one byte ``B1`` or the master closes.

The master sends only entries with a timestamp greater than the one asked for, and skips
entries whose origin server id equals the slave's `sid` (so a slave never gets back its
own writes). A KT timestamp is milliseconds × 10⁶ plus a logical counter: unique and
increasing within one master's log, hence a cursor.

A message is ``sid u16 | dbid u16 | op | ...`` with KT's `TimedDB` operations: ``A1 ksiz
vsiz key value`` (set; sizes as KC varnums), ``A2 ksiz key`` (remove), ``A5`` (clear). In a
database opened without ``ktopts=p`` each stored value starts with a 5-byte big-endian
expiry time (`XT_NONE` = never).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from core.errors import MercuryError

MAGIC_NOP = 0xB0
MAGIC_REPLICATION = 0xB1
MAGIC_ERROR = 0xBF
#: TimedDB update operations (kttimeddb.h: UNOP = 0xA0, then in order).
OP_SET = 0xA1
OP_REMOVE = 0xA2
OP_CLEAR = 0xA5
#: Width and "never" value of the expiry time prefixed to values of non-persistent dbs.
XT_WIDTH = 5
XT_NONE = (1 << 40) - 1
#: Largest message accepted (KT's own DATAMAXSIZ).
MAX_MESSAGE = 1 << 28

_HELLO = struct.Struct(">BIQH")
_ENTRY_HEAD = struct.Struct(">QI")
_U64 = struct.Struct(">Q")
_SID_DBID = struct.Struct(">HH")


class KtStreamError(MercuryError):
    """The replication stream or a message in it is malformed."""


def hello(ts: int, sid: int, flags: int = 0) -> bytes:
    """The request a slave sends to start replication after timestamp `ts`."""
    return _HELLO.pack(MAGIC_REPLICATION, flags, ts, sid)


@dataclass(frozen=True, slots=True)
class Entry:
    """One update-log entry of the stream (`message` empty for a dummy)."""

    ts: int
    message: bytes


@dataclass(frozen=True, slots=True)
class Nop:
    """The master had nothing new at `ts`; the slave must answer ``B1``."""

    ts: int


Event = Entry | Nop


class StreamParser:
    """Incremental parser of the master's side, after its one-byte acceptance.

    `feed(data)` returns the events completed by `data` (bytes of a partial event are kept
    for the next call). Raises `KtStreamError` on an unknown magic or an oversized entry.
    """

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self.buf = bytearray()
        self.max_message = max_message

    def feed(self, data: bytes) -> list[Event]:
        buf = self.buf
        buf += data
        out: list[Event] = []
        pos = 0
        n = len(buf)
        while pos < n:
            magic = buf[pos]
            if magic == MAGIC_NOP:
                if n - pos < 9:
                    break
                out.append(Nop(_U64.unpack_from(buf, pos + 1)[0]))
                pos += 9
            elif magic == MAGIC_REPLICATION:
                if n - pos < 13:
                    break
                ts, size = _ENTRY_HEAD.unpack_from(buf, pos + 1)
                if size > self.max_message:
                    raise KtStreamError(f"replication entry of {size} bytes (ts {ts})")
                if n - pos < 13 + size:
                    break
                out.append(Entry(ts, bytes(buf[pos + 13 : pos + 13 + size])))
                pos += 13 + size
            else:
                raise KtStreamError(f"unknown replication magic 0x{magic:02x}")
        del buf[:pos]
        return out


def read_varnum(buf: bytes, pos: int) -> tuple[int, int]:
    """Kyoto Cabinet's varnum at `pos` (7 bits a byte, most significant first, high bit set
    on every byte but the last): (value, position after it)."""
    num = 0
    for i in range(pos, min(len(buf), pos + 10)):
        c = buf[i]
        num = (num << 7) | (c & 0x7F)
        if c < 0x80:
            return num, i + 1
    raise KtStreamError("truncated or overlong varnum")


def write_varnum(num: int) -> bytes:
    """The inverse of `read_varnum` (tests and the recorder's fixtures)."""
    out = [num & 0x7F]
    num >>= 7
    while num:
        out.append(0x80 | (num & 0x7F))
        num >>= 7
    return bytes(reversed(out))


@dataclass(frozen=True, slots=True)
class Change:
    """One decoded update: `kind` is "set", "remove", "clear" or "other" (an operation the
    bridge ignores); `xt` the expiry of a set value (`XT_NONE` when none or unknown)."""

    ts: int
    sid: int
    dbid: int
    kind: str
    key: bytes = b""
    value: bytes = b""
    xt: int = XT_NONE


def decode(entry: Entry, *, persistent: bool = False) -> Change | None:
    """The change an entry carries (None for a dummy). `persistent`: the database was
    opened with ``ktopts=p``, so values carry no expiry prefix."""
    msg = entry.message
    if not msg:
        return None
    if len(msg) < 5:
        raise KtStreamError(f"update-log message of {len(msg)} bytes (ts {entry.ts})")
    sid, dbid = _SID_DBID.unpack_from(msg)
    op = msg[4]
    if op == OP_SET:
        ksiz, p = read_varnum(msg, 5)
        vsiz, p = read_varnum(msg, p)
        if len(msg) - p != ksiz + vsiz:
            raise KtStreamError(f"set message sizes do not add up (ts {entry.ts})")
        key = msg[p : p + ksiz]
        value = msg[p + ksiz :]
        xt = XT_NONE
        if not persistent:
            if len(value) < XT_WIDTH:
                raise KtStreamError(f"set value without its expiry time (ts {entry.ts})")
            xt = int.from_bytes(value[:XT_WIDTH], "big")
            value = value[XT_WIDTH:]
        return Change(entry.ts, sid, dbid, "set", key, value, xt)
    if op == OP_REMOVE:
        ksiz, p = read_varnum(msg, 5)
        if len(msg) - p != ksiz:
            raise KtStreamError(f"remove message size does not add up (ts {entry.ts})")
        return Change(entry.ts, sid, dbid, "remove", msg[p:])
    if op == OP_CLEAR:
        return Change(entry.ts, sid, dbid, "clear")
    return Change(entry.ts, sid, dbid, "other")


def encode_set(sid: int, dbid: int, key: bytes, value: bytes, xt: int | None = XT_NONE) -> bytes:
    """A set message as KT writes it (`xt` None: a persistent database's, no prefix)."""
    body = value if xt is None else xt.to_bytes(XT_WIDTH, "big") + value
    return (
        _SID_DBID.pack(sid, dbid)
        + bytes([OP_SET])
        + write_varnum(len(key))
        + write_varnum(len(body))
        + key
        + body
    )


def encode_entry(ts: int, message: bytes) -> bytes:
    """One stream entry as the master sends it."""
    return bytes([MAGIC_REPLICATION]) + _ENTRY_HEAD.pack(ts, len(message)) + message
