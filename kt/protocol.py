"""Kyoto Tycoon wire protocols, pure parsing and encoding (no I/O).

One port serves HTTP/1.x (RESTful and TSV-RPC) and the binary protocol; the first byte of
each request decides (0x00 or >= 0x80: binary). The protocol is summarised in
docs/reads.md; where Kyoto Tycoon's server behaves otherwise than its documentation says,
this module follows the server's behaviour (what existing clients were written against).

Parsers take the bytes received so far and return ``(request, bytes consumed)`` or None when
more bytes are needed; malformed or oversized input raises `ReadProtocolError` carrying the
HTTP status to answer (`status`, None = close silently as KT does).
"""

from __future__ import annotations

import base64
import binascii
import heapq
import itertools
import re
import struct
from collections.abc import Generator
from dataclasses import dataclass, field
from email.utils import formatdate
from urllib.parse import unquote_to_bytes

from core.errors import ReadProtocolError
from core.slices import CHUNK, SliceClock

# --- limits ---------------------------------------------------------------------------

#: Request line and each header line (KT's LINEBUFSIZ).
MAX_LINE = 8192
MAX_HEADERS = 100
#: HTTP body and whole binary request. KT allows 256 MiB; a read-only node needs far less.
MAX_BODY = 16 << 20
#: Records in one binary request.
MAX_RECORDS = 1 << 20
#: Chunks in one chunked HTTP body (bounds the positions kept while one is received).
MAX_CHUNKS = 4096

# --- binary protocol ------------------------------------------------------------------

MAGIC_NOP = 0xB0
MAGIC_REPLICATION = 0xB1
MAGIC_PLAY_SCRIPT = 0xB4
MAGIC_SET_BULK = 0xB8
MAGIC_REMOVE_BULK = 0xB9
MAGIC_GET_BULK = 0xBA
MAGIC_ERROR = 0xBF
#: Binary flag: the client wants no reply (set_bulk, remove_bulk, play_script).
BONOREPLY = 0x01
#: Expiry "none" in binary replies (40-bit XTMAX).
XT_NONE = 0xFFFFFFFFFF

_HDR = struct.Struct(">BII")  # magic, flags, rnum
_U16U32 = struct.Struct(">HI")
_SET_REC = struct.Struct(">HIIq")
_U32U32 = struct.Struct(">II")
_SCRIPT_HDR = struct.Struct(">BIII")
_REPL = struct.Struct(">BIQH")
GET_REPLY_REC = struct.Struct(">HIIq")
_MAGIC_HITS = struct.Struct(">BI")


def is_binary(first_byte: int) -> bool:
    """Whether a request starting with this byte is binary (else HTTP)."""
    return first_byte == 0 or first_byte >= 0x80


@dataclass(frozen=True, slots=True)
class BinaryRequest:
    """A parsed binary request. `keys` holds (dbidx, key) of get_bulk/remove_bulk/set_bulk,
    `values` the values of set_bulk and `xts` their expiry times (KT's signed `xt`, in the
    same order); `no_reply` is BONOREPLY."""

    magic: int
    flags: int = 0
    keys: list[tuple[int, bytes]] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)
    xts: list[int] = field(default_factory=list)

    @property
    def no_reply(self) -> bool:
        return bool(self.flags & BONOREPLY) and self.magic in (
            MAGIC_SET_BULK,
            MAGIC_REMOVE_BULK,
            MAGIC_PLAY_SCRIPT,
        )


#: Records one `BinaryParser.feed` call parses at most (a slice of a big request).
PARSE_SLICE = 8192


class BinaryParser:
    """Parses one binary request at the front of a buffer incrementally: where it stopped
    (offset, records left, keys so far) is kept across calls, so a request arriving in
    many TCP segments is parsed once in all — not again from byte 0 on every segment —
    and each call parses at most `budget` records.

    `feed(buf)` returns (request, bytes consumed) when the request is complete (the
    parser is then ready for the next one), else None: `starved` says whether it needs
    more bytes (True) or only stopped at its budget (False: call again). Malformed or
    oversized input raises ReadProtocolError(status=None): KT closes silently.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the request in progress (after it completed or failed)."""
        self.magic = -1
        self.flags = 0
        self.left = 0  # records still to parse
        self.pos = 0  # offset of the next unparsed byte
        self.keys: list[tuple[int, bytes]] = []
        self.values: list[bytes] = []
        self.xts: list[int] = []
        self.starved = True

    @property
    def busy(self) -> bool:
        """True while a request is partly parsed."""
        return self.magic >= 0

    def feed(
        self, buf: bytes | bytearray, budget: int = PARSE_SLICE
    ) -> tuple[BinaryRequest, int] | None:
        self.starved = True
        if not buf:
            return None
        if self.magic < 0 and not self._start(buf):
            return None
        magic = self.magic
        if magic == MAGIC_REPLICATION:
            return self._done(BinaryRequest(magic, self.flags))
        pos, left = self.pos, self.left
        n = len(buf)
        try:
            if magic == MAGIC_PLAY_SCRIPT:
                while left and budget:
                    if pos + 8 > n:
                        return None
                    ksiz, vsiz = _U32U32.unpack_from(buf, pos)
                    end = pos + 8 + ksiz + vsiz
                    _limit(end)
                    if end > n:
                        return None
                    pos, left, budget = end, left - 1, budget - 1
            elif magic == MAGIC_SET_BULK:
                keys, values, xts = self.keys, self.values, self.xts
                while left and budget:
                    if pos + _SET_REC.size > n:
                        return None
                    dbidx, ksiz, vsiz, xt = _SET_REC.unpack_from(buf, pos)
                    a = pos + _SET_REC.size
                    end = a + ksiz + vsiz
                    _limit(end)
                    if end > n:
                        return None
                    keys.append((dbidx, bytes(buf[a : a + ksiz])))
                    values.append(bytes(buf[a + ksiz : end]))
                    xts.append(xt)
                    pos, left, budget = end, left - 1, budget - 1
            else:
                keys = self.keys
                while left and budget:
                    if pos + _U16U32.size > n:
                        return None
                    dbidx, ksiz = _U16U32.unpack_from(buf, pos)
                    a = pos + _U16U32.size
                    end = a + ksiz
                    _limit(end)
                    if end > n:
                        return None
                    keys.append((dbidx, bytes(buf[a:end])))
                    pos, left, budget = end, left - 1, budget - 1
        finally:
            self.pos, self.left = pos, left
        if left:
            self.starved = False
            return None
        if magic == MAGIC_PLAY_SCRIPT:
            return self._done(BinaryRequest(magic, self.flags))
        return self._done(BinaryRequest(magic, self.flags, self.keys, self.values, self.xts))

    def _start(self, buf: bytes | bytearray) -> bool:
        """Parse the fixed header of a new request; False when it is not all here."""
        magic = buf[0]
        if magic == MAGIC_REPLICATION:
            if len(buf) < _REPL.size:
                return False
            _, flags, _ts, _sid = _REPL.unpack_from(buf)
            self.magic, self.flags, self.pos = magic, flags, _REPL.size
            return True
        if magic == MAGIC_PLAY_SCRIPT:
            if len(buf) < _SCRIPT_HDR.size:
                return False
            _, flags, nsiz, rnum = _SCRIPT_HDR.unpack_from(buf)
            _check_rnum(rnum)
            _limit(_SCRIPT_HDR.size + nsiz)
            self.magic, self.flags, self.left = magic, flags, rnum
            self.pos = _SCRIPT_HDR.size + nsiz
            return True
        if magic not in (MAGIC_SET_BULK, MAGIC_REMOVE_BULK, MAGIC_GET_BULK):
            raise ReadProtocolError(f"unknown binary magic 0x{magic:02x}", status=None, close=True)
        if len(buf) < _HDR.size:
            return False
        _, flags, rnum = _HDR.unpack_from(buf)
        _check_rnum(rnum)
        self.magic, self.flags, self.left, self.pos = magic, flags, rnum, _HDR.size
        return True

    def _done(self, req: BinaryRequest) -> tuple[BinaryRequest, int] | None:
        pos = self.pos
        self.reset()
        self.starved = False
        return req, pos


def _limit(end: int) -> None:
    if end > MAX_BODY:
        raise ReadProtocolError("binary request too large", status=None, close=True)


def parse_binary(buf: bytes | bytearray) -> tuple[BinaryRequest, int] | None:
    """Parse one binary request at the start of `buf` (None: incomplete), from scratch.

    Unknown magic bytes raise ReadProtocolError(status=None): KT closes silently. A
    listener keeps a `BinaryParser` per connection instead (parsing each byte once).
    """
    if not buf:
        return None
    return BinaryParser().feed(buf, budget=MAX_RECORDS + 1)


def binary_phase(buf: bytes | bytearray) -> str:
    """ "header" while a binary request's fixed header is incomplete, else "body"."""
    magic = buf[0] if buf else 0
    size = {
        MAGIC_REPLICATION: _REPL.size,
        MAGIC_PLAY_SCRIPT: _SCRIPT_HDR.size,
    }.get(magic, _HDR.size)
    return "header" if len(buf) < size else "body"


def _check_rnum(rnum: int) -> None:
    if rnum > MAX_RECORDS:
        raise ReadProtocolError(f"binary request of {rnum} records", status=None, close=True)


def encode_get_bulk_reply(hits: list[tuple[int, bytes, bytes, int]]) -> bytes:
    """``BA | hits | {dbidx, ksiz, vsiz, xt, key, value}...`` for (dbidx, key, value, xt)
    hits; xt is the key's expiry in Unix seconds, `XT_NONE` when it has none."""
    parts = [get_bulk_reply_head(len(hits))]
    pack = GET_REPLY_REC.pack
    for dbidx, key, value, xt in hits:
        parts.append(pack(dbidx, len(key), len(value), xt))
        parts.append(key)
        parts.append(value)
    return b"".join(parts)


def bulk_count_reply(magic: int, count: int) -> bytes:
    """Reply of a binary set_bulk/remove_bulk: its magic and how many records it did."""
    return _MAGIC_HITS.pack(magic, count)


def get_bulk_reply_head(hits: int) -> bytes:
    """The first 5 bytes of a get_bulk reply: magic and the number of hits."""
    return _MAGIC_HITS.pack(MAGIC_GET_BULK, hits)


BINARY_ERROR = bytes([MAGIC_ERROR])

# --- HTTP -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One HTTP request: `headers` has lower-case names (last one wins)."""

    method: str
    target: bytes
    version: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        """KT's rule: on for HTTP/1.1, off for 1.0, `Connection` overrides."""
        conn = self.headers.get("connection", "").lower()
        if "close" in conn:
            return False
        if "keep-alive" in conn:
            return True
        return self.version == "HTTP/1.1"

    @property
    def path(self) -> bytes:
        """The target without its query string (still percent-encoded)."""
        return self.target.split(b"?", 1)[0]

    @property
    def query(self) -> bytes:
        """The query string (without `?`), or empty."""
        parts = self.target.split(b"?", 1)
        return parts[1] if len(parts) == 2 else b""


_BODY_METHODS = {"POST", "PUT"}
_KNOWN_METHODS = {"GET", "HEAD", "POST", "PUT", "DELETE"}

# Where an `HttpParser` is in a request.
_HEAD = 0  # request line and headers
_LENGTH = 1  # a Content-Length body
_SIZE = 2  # a chunk size line
_DATA = 3  # a chunk's data
_DATA_END = 4  # the line end after a chunk's data
_TRAILER = 5  # trailer lines after the last chunk
#: What the line a state waits for is called in errors ("... too long").
_LINE_NAMES = {
    _HEAD: "request line or header",
    _SIZE: "chunk size line",
    _DATA_END: "line after chunk data",
    _TRAILER: "trailer",
}


class HttpParser:
    """Parses one HTTP/1.x request at the front of a buffer incrementally: where it stopped
    (offset, head lines, chunk positions) is kept across calls, so a request arriving in
    many TCP segments — a chunked body of thousands of chunks dribbled a byte at a time —
    costs work in proportion to its bytes in all, not a re-scan from byte 0 per segment.

    `feed(buf)` returns (request, bytes consumed) when the request is complete (the parser
    is then ready for the next one), else None: it needs more bytes. `buf` must keep the
    bytes it held at the previous call (the request starts at offset 0). Raises
    ReadProtocolError with status 400 (bad request line, header, chunked body), 413 (body
    over MAX_BODY) or None (a version other than HTTP/1.0 or 1.1: close silently); the
    caller then resets the parser.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the request in progress (after it completed or failed)."""
        self.state = _HEAD
        self.pos = 0  # offset of the next unparsed byte
        self.scanned = 0  # no line end in buf[pos:scanned] (where a line search resumes)
        self.lines: list[bytes] = []  # request line and header lines so far
        self.blanks = 0  # empty lines before the request line
        self.count = 0  # trailer lines so far
        self.head: tuple[str, bytes, str, dict[str, str]] | None = None
        self.length = 0  # Content-Length, or the size of the chunk being received
        self.total = 0  # chunk sizes so far
        self.spans: list[tuple[int, int]] = []  # (offset, size) of each chunk's data

    @property
    def head_done(self) -> bool:
        """True once the request's head is parsed (its body is being received)."""
        return self.state != _HEAD

    def feed(self, buf: bytes | bytearray) -> tuple[HttpRequest, int] | None:
        if self.state == _HEAD and not self._head(buf):
            return None
        if self.state == _LENGTH:
            start = self.pos
            end = start + self.length
            if len(buf) < end:
                return None
            self.pos = end
            return self._done(bytes(buf[start:end]))
        if not self._chunked(buf):
            return None
        return self._done(b"".join(bytes(buf[a : a + n]) for a, n in self.spans))

    def _line(self, buf: bytes | bytearray, what: str) -> bytes | None:
        """The next line (without its `\\n`) or None when it is not all here; only bytes
        not searched before are searched. A line over MAX_LINE is a 400."""
        pos = self.pos
        nl = buf.find(b"\n", max(self.scanned, pos), pos + MAX_LINE + 1)
        if nl < 0:
            if len(buf) - pos > MAX_LINE:
                raise ReadProtocolError(f"{what} too long", status=400, close=True)
            self.scanned = len(buf)
            return None
        self.pos = self.scanned = nl + 1
        return bytes(buf[pos:nl])

    def _head(self, buf: bytes | bytearray) -> bool:
        """Parse the request line and headers; False when they are not all here."""
        lines = self.lines
        while True:
            line = self._line(buf, _LINE_NAMES[_HEAD])
            if line is None:
                return False
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if lines:
                    break
                # stray empty lines between requests are skipped, a bounded number
                self.blanks += 1
                if self.blanks > MAX_HEADERS:
                    raise ReadProtocolError("too many empty lines", status=400, close=True)
                continue
            lines.append(line)
            if len(lines) > MAX_HEADERS + 1:
                raise ReadProtocolError("too many header lines", status=400, close=True)
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise ReadProtocolError("malformed request line", status=400, close=True)
        method_b, target, version_b = parts
        if version_b not in (b"HTTP/1.0", b"HTTP/1.1"):
            raise ReadProtocolError("unsupported HTTP version", status=None, close=True)
        headers: dict[str, str] = {}
        for h in lines[1:]:
            name, sep, value = h.partition(b":")
            if not sep or not name.strip():
                raise ReadProtocolError("malformed header line", status=400, close=True)
            headers[name.strip().decode("latin-1").lower()] = value.strip().decode("latin-1")
        method = method_b.decode("latin-1").upper()
        self.head = (method, target, version_b.decode(), headers)
        self.state = _LENGTH  # no body: a Content-Length of 0
        if method in _BODY_METHODS or method not in _KNOWN_METHODS:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self.state = _SIZE
            elif "content-length" in headers:
                try:
                    n = int(headers["content-length"])
                except ValueError as err:
                    raise ReadProtocolError("bad Content-Length", status=400, close=True) from err
                if n < 0:
                    raise ReadProtocolError("bad Content-Length", status=400, close=True)
                if n > MAX_BODY:
                    raise ReadProtocolError("request body too large", status=413, close=True)
                self.length = n
        return True

    def _chunked(self, buf: bytes | bytearray) -> bool:
        """Go on with a chunked body; True once it is complete (with its trailers).

        Only positions are kept (at most MAX_CHUNKS chunks); the data is copied once, when
        the body is complete."""
        while True:
            state = self.state
            if state == _DATA:
                end = self.pos + self.length
                if len(buf) < end:
                    return False
                self.spans.append((self.pos, self.length))
                self.pos = end
                self.state = _DATA_END
                continue
            line = self._line(buf, _LINE_NAMES[state])
            if line is None:
                return False
            if state == _DATA_END:
                self.state = _SIZE
            elif state == _SIZE:
                self._chunk_size(line)
            elif not line.rstrip(b"\r"):
                return True  # the empty line ending the trailers
            else:
                self.count += 1
                if self.count > MAX_HEADERS:
                    raise ReadProtocolError("too many trailer lines", status=400, close=True)

    def _chunk_size(self, line: bytes) -> None:
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as err:
            raise ReadProtocolError("bad chunk size", status=400, close=True) from err
        if size < 0:
            raise ReadProtocolError("bad chunk size", status=400, close=True)
        self.total += size
        if self.total > MAX_BODY:
            raise ReadProtocolError("request body too large", status=413, close=True)
        if size == 0:
            self.state = _TRAILER
            return
        if len(self.spans) >= MAX_CHUNKS:
            raise ReadProtocolError("too many chunks", status=400, close=True)
        self.length = size
        self.state = _DATA

    def _done(self, body: bytes) -> tuple[HttpRequest, int]:
        assert self.head is not None
        method, target, version, headers = self.head
        n = self.pos
        self.reset()
        return HttpRequest(method, target, version, headers, body), n


def parse_http(buf: bytes | bytearray) -> tuple[HttpRequest, int] | None:
    """Parse one HTTP/1.x request at the start of `buf` (None: incomplete), from scratch
    (tests and tools; a listener keeps an `HttpParser` per connection instead)."""
    return HttpParser().feed(buf)


REASONS = {
    200: "OK",
    201: "Created",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    413: "Request Entity Too Large",
    421: "Misdirected Request",  # a filtered replica's key outside its keyspaces
    450: "Logical Inconsistency",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}


def http_date(now: float | None = None) -> str:
    """RFC 1123 GMT date for the Date header."""
    return formatdate(now, usegmt=True)


def encode_http_response(
    status: int,
    body: bytes = b"",
    *,
    headers: list[tuple[str, str]] | None = None,
    keep_alive: bool = True,
    head: bool = False,
    content_length: int | None = None,
    date: str | None = None,
) -> bytes:
    """A full HTTP/1.1 response as KT writes it (Server, Date, Content-Length; `Connection:
    close` when the server will close). With `head`, the body is left out but
    Content-Length still says `content_length` (the value size on a RESTful HEAD)."""
    lines = [
        f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}",
        "Server: KyotoTycoon/1.0.0",
        f"Date: {date or http_date()}",
    ]
    for name, value in headers or ():
        lines.append(f"{name}: {value}")
    n = len(body) if content_length is None else content_length
    lines.append(f"Content-Length: {n}")
    if not keep_alive:
        lines.append("Connection: close")
    head_bytes = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head_bytes if head else head_bytes + body


def error_body(status: int, reason: str) -> bytes:
    """KT's plain-text body for a malformed request, e.g. `400 Bad Request (...)`."""
    return f"{status} {REASONS.get(status, 'Error')} ({reason})\n".encode()


# --- URL and TSV encodings ---------------------------------------------------------------

_URL_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.!~*'()")


def url_decode(raw: bytes) -> bytes:
    """KT's urldecode: `%XX` escapes and `+` as a space."""
    return unquote_to_bytes(raw.replace(b"+", b" "))


def url_encode(raw: bytes) -> bytes:
    """KT's urlencode: unreserved bytes kept, every other byte as `%XX` (upper case)."""
    return b"".join(bytes([c]) if c in _URL_SAFE else b"%%%02X" % c for c in raw)


def parse_form(raw: bytes) -> dict[bytes, bytes]:
    """`k=v&k2=v2` (or `;`) URL-decoded into a map; a part without `=` has an empty value.
    A broken escape (`%zz`, `%` at the end) raises ReadProtocolError(400), as a TSV column
    invalid in its `colenc` does (`decode_column`)."""
    out: dict[bytes, bytes] = {}
    _form_parts(raw.replace(b";", b"&").split(b"&"), out)
    return out


def _form_parts(parts: list[bytes], out: dict[bytes, bytes]) -> None:
    for part in parts:
        if not part:
            continue
        if _BAD_URL_ESCAPE.search(part):
            # decoded leniently, `%zz` would stay `%zz`: a key the client did not name
            raise ReadProtocolError("invalid URL-encoded parameter", status=400)
        k, _, v = part.partition(b"=")
        out[url_decode(k)] = url_decode(v)


def colenc_of(content_type: str) -> str | None:
    """The `colenc` attribute of a TSV Content-Type (`B`, `Q`, `U`) or None; parsed loosely
    (`; colenc=B`, `;colenc="b"`)."""
    for attr in content_type.split(";")[1:]:
        name, _, value = attr.partition("=")
        if name.strip().lower() == "colenc":
            v = value.strip().strip('"').upper()
            return v[:1] or None
    return None


#: An escape that is not one: `%` not followed by two hex digits (URL encoding), `=` not
#: followed by two hex digits, a line end or the end of the column (quoted-printable).
_BAD_URL_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})")
_BAD_QP_ESCAPE = re.compile(rb"=(?![0-9A-Fa-f]{2}|\r?\n|\Z)")


def decode_column(raw: bytes, colenc: str | None) -> bytes:
    """Decode one TSV column. A column that is not valid in the encoding its Content-Type
    declares (a character outside Base64's alphabet, bad padding, `%zz`, `=zz`) raises
    ReadProtocolError(400): guessing what the client meant would read or write another key
    than the one it named."""
    if colenc == "B":
        try:
            return binascii.a2b_base64(raw, strict_mode=True)
        except binascii.Error as err:
            raise ReadProtocolError(f"invalid base64 column ({err})", status=400) from err
    if colenc == "Q":
        if _BAD_QP_ESCAPE.search(raw):
            raise ReadProtocolError("invalid quoted-printable column", status=400)
        return binascii.a2b_qp(raw)
    if colenc == "U":
        if _BAD_URL_ESCAPE.search(raw):
            raise ReadProtocolError("invalid URL-encoded column", status=400)
        return url_decode(raw)
    return raw


def parse_tsv(body: bytes, colenc: str | None) -> dict[bytes, bytes]:
    """TSV body -> map: `key<TAB>value` lines (optional `\\r` stripped); a line without a TAB
    is ignored; only the first TAB splits; with `colenc` both columns are decoded."""
    out: dict[bytes, bytes] = {}
    _tsv_lines(body.split(b"\n"), colenc, out)
    return out


def _tsv_lines(lines: list[bytes], colenc: str | None, out: dict[bytes, bytes]) -> None:
    for line in lines:
        if line.endswith(b"\r"):
            line = line[:-1]
        k, tab, v = line.partition(b"\t")
        if not tab:
            continue
        out[decode_column(k, colenc)] = decode_column(v, colenc)


def bad_path(err: ReadProtocolError, keep_alive: bool, date: str | None) -> bytes:
    """The RESTful answer to a path `rest_key` refused: 400 naming what was wrong."""
    return encode_http_response(
        400,
        err.message.encode() + b"\n",
        headers=[("Content-Type", "text/plain")],
        keep_alive=keep_alive,
        date=date,
    )


#: KT's signal parameters, which any RPC call may carry: ``WAIT`` (block on a named
#: condition, up to ``WAITTIME`` seconds, then 503) and ``SIGNAL`` (wake its waiters;
#: ``SIGNALBROAD`` all of them). Mercury has no named conditions, and a call that ignored
#: them would wait for nothing or wake no one while answering as if it had.
SIGNAL_PARAMS = (b"WAIT", b"SIGNAL")


def signal_refusal(params: dict[bytes, bytes]) -> tuple[int, dict[bytes, bytes]] | None:
    """The 501 for an RPC call carrying KT's WAIT or SIGNAL parameter, else None."""
    given = [p for p in SIGNAL_PARAMS if p in params]
    if not given:
        return None
    return 501, {
        b"ERROR": b"not implemented: the "
        + b" and ".join(given)
        + b" parameter (KT's signals) is not offered by Mercury"
    }


def bad_input(err: ReadProtocolError) -> tuple[int, dict[bytes, bytes]]:
    """The TSV-RPC answer to input `rpc_input` refused: 400 naming what was wrong."""
    return 400, {b"ERROR": b"invalid parameters: " + err.message.encode()}


def rpc_input(req: HttpRequest) -> dict[bytes, bytes]:
    """The TSV-RPC input map: query string, then the body chosen by Content-Type (later keys
    overwrite earlier ones)."""
    gen = rpc_input_slices(req)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            params: dict[bytes, bytes] = stop.value
            return params


#: Body lines (TSV) or parts (form) `rpc_input_slices` decodes between two looks at the
#: slice clock (`core/slices.py`: a slice ends after `SLICE_S`, whatever the count).
RPC_SLICE = CHUNK


def rpc_input_slices(req: HttpRequest) -> Generator[bytes, None, dict[bytes, bytes]]:
    """`rpc_input` in time-bounded slices (`core.slices.SliceClock`), yielding b"" between
    them (a 16 MiB body of a million keys is decoded without holding a listener's loop);
    returns the map. Raises ReadProtocolError(400) on a TSV column invalid in its `colenc`
    and on a broken `%` escape in the query string or a form body (`parse_form`)."""
    params = parse_form(req.query)
    ctype = req.headers.get("content-type", "")
    low = ctype.lower()
    clock = SliceClock()
    if low.startswith("application/x-www-form-urlencoded"):
        parts = req.body.replace(b";", b"&").split(b"&")
        for i in range(0, len(parts), RPC_SLICE):
            if clock.due():
                yield b""
                clock.start()
            _form_parts(parts[i : i + RPC_SLICE], params)
    elif low.startswith("text/tab-separated-values"):
        colenc = colenc_of(ctype)
        lines = req.body.split(b"\n")
        for i in range(0, len(lines), RPC_SLICE):
            if clock.due():
                yield b""
                clock.start()
            _tsv_lines(lines[i : i + RPC_SLICE], colenc, params)
    return params


_RAW_SAFE = bytes(range(0x20, 0x7F)) + bytes(range(0x80, 0x100))


def _needs_encoding(col: bytes) -> bool:
    return len(col) > 255 or bool(col.translate(None, _RAW_SAFE))


def _b64_len(col: bytes) -> int:
    # KT's estimate (`checkmapenc`), not Base64's real length: clients were written
    # against the encoding KT actually picks
    return min(len(col), 255) * 6 // 4 + 3


def _url_len(col: bytes) -> int:
    head = col[:255]
    return sum(1 if c in _URL_SAFE else 3 for c in head)


def encode_tsv(out: dict[bytes, bytes]) -> tuple[bytes, str]:
    """Serialise an output map the way KT does (`checkmapenc`): lines sorted by key, raw
    when every column is short and printable, else `colenc=B` or `U`, whichever is smaller
    over the first 255 bytes of each column. Returns (body, Content-Type)."""
    gen = encode_tsv_slices(out)
    while True:
        try:
            next(gen)
        except StopIteration as stop:
            body, ctype = stop.value
            return bytes(body), str(ctype)


def sorted_slices(
    out: dict[bytes, bytes], clock: SliceClock
) -> Generator[bytes, None, list[bytes]]:
    """`sorted(out)` (the keys) in time-bounded slices: runs sorted one at a time, then
    merged (`heapq.merge`, lazily, a chunk at a time), yielding b"" between. Keys only,
    not (key, value) pairs: a million pairs alive at once would be a million more objects
    for the cyclic collector to walk, in pauses of seconds."""
    keys = list(out)
    runs: list[list[bytes]] = []
    for i in range(0, len(keys), RPC_SLICE * 16):
        if clock.due():
            yield b""
            clock.start()
        runs.append(sorted(keys[i : i + RPC_SLICE * 16]))
    if len(runs) <= 1:
        return runs[0] if runs else []
    merged = heapq.merge(*runs)
    result: list[bytes] = []
    while True:
        if clock.due():
            yield b""
            clock.start()
        chunk = list(itertools.islice(merged, RPC_SLICE))
        if not chunk:
            return result
        result.extend(chunk)


def encode_tsv_slices(out: dict[bytes, bytes]) -> Generator[bytes, None, tuple[bytes, str]]:
    """`encode_tsv` in time-bounded slices, yielding b"" between them."""
    pieces, ctype = yield from tsv_pieces(out)
    return b"".join(pieces), ctype


#: Bytes of encoded lines joined into one piece of a reply (`tsv_pieces`).
PIECE_BYTES = 256 << 10


def tsv_pieces(out: dict[bytes, bytes]) -> Generator[bytes, None, tuple[list[bytes], str]]:
    """`encode_tsv`'s body as pieces of about PIECE_BYTES, in time-bounded slices
    (yielding b"" between them): a reply of a million lines is never joined, or written,
    in one step of the loop."""
    clock = SliceClock()
    keys = yield from sorted_slices(out, clock)
    n = len(keys)
    ctype = "text/tab-separated-values"
    needs = False
    for i in range(0, n, RPC_SLICE):
        if clock.due():
            yield b""
            clock.start()
        if any(_needs_encoding(k) or _needs_encoding(out[k]) for k in keys[i : i + RPC_SLICE]):
            needs = True
            break
    if needs:
        blen = ulen = 0
        for i in range(0, n, RPC_SLICE):
            if clock.due():
                yield b""
                clock.start()
            part = keys[i : i + RPC_SLICE]
            blen += sum(_b64_len(k) + _b64_len(out[k]) for k in part)
            ulen += sum(_url_len(k) + _url_len(out[k]) for k in part)
        enc = base64.b64encode if blen < ulen else url_encode
        ctype += "; colenc=B" if blen < ulen else "; colenc=U"
    pieces: list[bytes] = []
    lines: list[bytes] = []
    size = 0
    for i in range(0, n, RPC_SLICE):
        if clock.due():
            yield b""
            clock.start()
        part = keys[i : i + RPC_SLICE]
        if needs:
            more = [enc(k) + b"\t" + enc(out[k]) + b"\n" for k in part]
        else:
            more = [k + b"\t" + out[k] + b"\n" for k in part]
        lines.extend(more)
        size += sum(map(len, more))
        if size >= PIECE_BYTES:
            pieces.append(b"".join(lines))
            lines, size = [], 0
    if lines or not pieces:
        pieces.append(b"".join(lines))
    return pieces, ctype


def decode_tsv_response(body: bytes, content_type: str) -> dict[bytes, bytes]:
    """Client side of `encode_tsv` (tests and tools): body + Content-Type -> map."""
    return parse_tsv(body, colenc_of(content_type))


# --- RESTful paths ------------------------------------------------------------------------


def rest_key(path: bytes) -> tuple[bytes | None, bytes]:
    """RESTful target path -> (database selector or None, key), both URL-decoded.

    One leading `/` is optional (python-kyototycoon sends none). When the rest holds a `/`,
    the text before it selects the database and the key follows (extra `/` skipped); a key
    containing `/` must be sent as `%2F`. A broken escape (`%zz`) raises
    ReadProtocolError(400), as in a query string or a TSV column: decoded leniently it would
    name a key the client did not.
    """
    if b"%" in path and _BAD_URL_ESCAPE.search(path):  # (most paths hold no escape)
        raise ReadProtocolError("invalid URL-encoded path", status=400)
    if path.startswith(b"/"):
        path = path[1:]
    db, sep, rest = path.partition(b"/")
    if not sep:
        return None, url_decode(path)
    return url_decode(db), url_decode(rest.lstrip(b"/"))
