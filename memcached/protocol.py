"""memcached text protocol, pure parsing and encoding (no I/O).

Served: `get`/`gets` with any number of keys (`gets` adds the value's seq as its CAS
unique), `version`, `stats`, `verbosity`, `quit`. Storage and other write commands are
parsed in full (their data block is consumed, so the connection stays in sync) and
answered with a `SERVER_ERROR` (nothing with `noreply`). Unknown commands get `ERROR`.
Malformed lines get `CLIENT_ERROR ...`. A storage line is malformed or not, its data block
is consumed before the answer whenever its length can be read: a data block is the
client's bytes, never commands. Where the stream cannot be resynchronised — a storage line
whose block length cannot be read, a block not followed by CRLF where its length says, a
line over MAX_LINE, a block over MAX_DATA, the binary protocol — the answer is a
`CLIENT_ERROR` and the connection closes (what follows is never run as commands). A
command that begins with a byte no text command can begin with (`is_text_start`: a
control byte other than whitespace, DEL, or any byte >= 0x80 — the binary protocol's
request magic 0x80, its response magic 0x81, stray binary data) is not memcached text:
where it ends cannot be known, so it is answered at once, without waiting for a line end
— `ERROR` (memcached's answer to a command it does not know; 0x80: `CLIENT_ERROR binary
protocol not supported`) — and the connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from core.errors import ReadProtocolError
from store.format import MAX_KEY

#: Longest command line (a `get` of hundreds of keys fits).
MAX_LINE = 64 << 10
#: Largest data block of a (refused) storage command we consume to stay in sync.
MAX_DATA = 32 << 20

STORAGE = frozenset((b"set", b"add", b"replace", b"append", b"prepend", b"cas"))
OTHER_WRITES = frozenset((b"delete", b"incr", b"decr", b"touch", b"flush_all", b"gat", b"gats"))

END = b"END\r\n"
ERROR = b"ERROR\r\n"
READ_ONLY = b"SERVER_ERROR read-only Mercury node; write through the gateway\r\n"


#: Bytes a text command line can begin with: printable ASCII and the whitespace
#: `parse_command` skips (an empty line is answered `ERROR` and the connection goes on).
_TEXT_START = frozenset(range(0x20, 0x7F)) | frozenset(b"\t\n\r\x0b\x0c")


def is_text_start(first_byte: int) -> bool:
    """Whether a command beginning with this byte can be memcached text (see the module
    docstring); any other first byte is answered and the connection closed at once."""
    return first_byte in _TEXT_START


@dataclass(frozen=True, slots=True)
class Command:
    """One parsed command. `name` is the lower-cased verb; `keys` the keys of get/gets;
    `noreply` set for writes sent with `noreply`; `reply` a fixed answer decided by the
    parser (ERROR, CLIENT_ERROR) when the command is not one the server executes."""

    name: bytes
    keys: list[bytes] = field(default_factory=list)
    args: list[bytes] = field(default_factory=list)
    noreply: bool = False
    reply: bytes | None = None
    #: A storage command's data block (without its CRLF); the root's write listener
    #: stores it (memcached/writes.py).
    data: bytes = b""
    #: Close the connection after `reply`: the stream is not memcached text.
    close: bool = False


def client_error(msg: str) -> bytes:
    """`CLIENT_ERROR <msg>\\r\\n`."""
    return b"CLIENT_ERROR " + msg.encode() + b"\r\n"


def parse_command(buf: bytes | bytearray) -> tuple[Command, int] | None:
    """Parse one command at the start of `buf`: (command, bytes consumed) or None.

    Raises ReadProtocolError(close=True) for a line over MAX_LINE, a data block over
    MAX_DATA, or binary-protocol input; its message is the CLIENT_ERROR text. Any other
    first byte no text command begins with is `ERROR` with `close` set, consuming all of
    `buf`: nothing after it is run as commands.
    """
    if buf and not is_text_start(buf[0]):
        if buf[0] == 0x80:
            raise ReadProtocolError("binary protocol not supported", close=True)
        return Command(b"", reply=ERROR, close=True), len(buf)
    nl = buf.find(b"\n")
    if nl < 0:
        if len(buf) > MAX_LINE:
            raise ReadProtocolError("line too long", close=True)
        return None
    if nl > MAX_LINE:
        raise ReadProtocolError("line too long", close=True)
    line = bytes(buf[:nl])
    if line.endswith(b"\r"):
        line = line[:-1]
    pos = nl + 1
    tokens = line.split()
    if not tokens:
        return Command(b"", reply=ERROR), pos
    verb = tokens[0].lower()
    args = tokens[1:]
    if verb in (b"get", b"gets"):
        if not args:
            return Command(verb, reply=ERROR), pos
        if any(len(k) > MAX_KEY for k in args):
            return Command(verb, reply=client_error("bad command line format")), pos
        return Command(verb, keys=args), pos
    if verb in STORAGE:
        return _storage(verb, args, buf, pos)
    if verb in OTHER_WRITES:
        return Command(verb, args=args, noreply=bool(args) and args[-1] == b"noreply"), pos
    if verb in (b"version", b"stats", b"quit", b"verbosity"):
        return Command(verb, args=args), pos
    return Command(verb, reply=ERROR), pos


def block_length(args: list[bytes]) -> int | None:
    """The data block length a storage line declares (its arguments are `<key> <flags>
    <exptime> <bytes> ...`), or None when it cannot be read: too few arguments, or a
    `<bytes>` that is not a decimal number. A number too long to be a length reads as
    MAX_DATA + 1 (too large)."""
    if len(args) < 4 or not args[3].isdigit():
        return None
    raw = args[3].lstrip(b"0") or b"0"
    return int(raw) if len(raw) <= 10 else MAX_DATA + 1


def _storage(
    verb: bytes, args: list[bytes], buf: bytes | bytearray, pos: int
) -> tuple[Command, int] | None:
    """A storage line (`buf[:pos]`) and its data block. The block is consumed first, even
    for a line that is malformed otherwise: its bytes must never be run as commands."""
    nbytes = block_length(args)
    if nbytes is None:
        # where this command's data ends is unknown: nothing after it can be trusted
        raise ReadProtocolError("bad command line format", close=True)
    if nbytes > MAX_DATA:
        raise ReadProtocolError("object too large", close=True)
    end = pos + nbytes + 2
    if len(buf) < end:
        return None
    if buf[end - 2 : end] != b"\r\n":
        # the client's idea of the block's length is not ours: out of sync for good
        raise ReadProtocolError("bad data chunk", close=True)
    want = 6 if verb == b"cas" else 5
    if len(args) not in (want - 1, want) or not (args[1].isdigit() and _signed(args[2])):
        return Command(verb, reply=client_error("bad command line format")), end
    noreply = len(args) == want and args[-1] == b"noreply"
    return Command(verb, args=args, noreply=noreply, data=bytes(buf[pos : end - 2])), end


def _signed(raw: bytes) -> bool:
    """A decimal integer, optionally negative (a memcached exptime)."""
    return raw[1:].isdigit() if raw[:1] == b"-" else raw.isdigit()


def get_line(data: bytes, max_line: int = MAX_LINE) -> tuple[list[bytes], bool] | None:
    """(keys, with_cas) when `data` is exactly one CRLF-terminated `get`/`gets` line of at
    most `max_line` bytes (the keys unchecked); None for anything else."""
    if len(data) > max_line or data.find(b"\n") != len(data) - 1 or data[-2:] != b"\r\n":
        return None
    if data.startswith(b"get "):
        return data[4:-2].split(), False
    if data.startswith(b"gets "):
        return data[5:-2].split(), True
    return None


def lone_get(
    data: bytes, max_line: int = MAX_LINE, max_key: int = MAX_KEY
) -> tuple[bytes, bool] | None:
    """(key, with_cas) when `data` is exactly one `get`/`gets` line of one key that
    `parse_command` would accept (lower-case verb, CRLF-terminated, key of at most
    `max_key` bytes, the whole line at most `max_line`); None for anything else, which the
    caller then parses in full. The read listeners' shortcut (`reads/fastget.py`'s
    `McGet`, compiled in `reads/_fastget.pyx`)."""
    got = get_line(data, max_line)
    if got is None:
        return None
    keys, with_cas = got
    if len(keys) != 1 or len(keys[0]) > max_key:
        return None
    return keys[0], with_cas


def encode_values(
    hits: list[tuple[bytes, bytes, int]], with_cas: bool, flags_in_value: bool = False
) -> bytes:
    """`VALUE <key> <flags> <bytes>[ <cas>]` blocks for (key, value, seq) hits, then `END`.

    Flags are 0, or with `flags_in_value` (KT's memcached plug-in option `opts=f`, which
    stores a set's flags as the value's last 4 bytes, big-endian) taken from the value's
    last 4 bytes and cut from the data; a value shorter than 4 bytes has flags 0."""
    parts: list[bytes] = []
    for key, value, seq in hits:
        flags = 0
        if flags_in_value and len(value) >= 4:
            flags = int.from_bytes(value[-4:], "big")
            value = value[:-4]
        if with_cas:
            parts.append(b"VALUE %s %d %d %d\r\n" % (key, flags, len(value), seq))
        else:
            parts.append(b"VALUE %s %d %d\r\n" % (key, flags, len(value)))
        parts.append(value)
        parts.append(b"\r\n")
    parts.append(END)
    return b"".join(parts)


def encode_stats(stats: list[tuple[str, str | int]]) -> bytes:
    """`STAT <name> <value>` lines, then `END`."""
    return b"".join(b"STAT %s %s\r\n" % (n.encode(), str(v).encode()) for n, v in stats) + END
