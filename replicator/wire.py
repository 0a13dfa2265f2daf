"""Reading and writing frames on asyncio streams (the thin I/O adapter of `frames`).

Two readers of the same frames: `read_frame` over an `asyncio.StreamReader` (handshakes,
probes, the source's side) and `FrameReader`, which a replica's stream switches to after
its handshake: a buffered protocol that has the kernel copy each large frame body straight
into that body's own buffer. A StreamReader appends every chunk to one growing buffer and
cuts each frame back out of it (two more copies and a reallocation per chunk) — at tens of
MB/s of log records that was about a quarter of the applier's CPU.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import zlib
from typing import Any

from core.errors import ProtocolError
from replicator import frames
from store import codec
from store.format import LOG_HEADER, decode_log_header
from store.ops import LogRecord


async def read_frame(
    reader: asyncio.StreamReader, allowed: frozenset[int] | None = None
) -> tuple[int, bytes]:
    """Read one frame; return (type, body). `allowed`: the frame types acceptable here
    (None: any); the header is checked (type, its body bound) before any body byte is read.

    Raises ProtocolError on a bad header or CRC, and on a connection closed mid-frame or
    before any frame (`EOFError` semantics folded in: the caller reconnects either way).
    """
    try:
        raw = await reader.readexactly(frames.HEADER_SIZE)
    except asyncio.IncompleteReadError as err:
        raise ProtocolError("connection closed by the peer") from err
    try:
        h = frames.decode_header(raw, allowed)
    except ValueError as err:
        raise ProtocolError(f"bad frame header: {err}") from err
    try:
        body = await reader.readexactly(h.length) if h.length else b""
    except asyncio.IncompleteReadError as err:
        raise ProtocolError(
            f"frame truncated: got {len(err.partial)} of {h.length} body bytes"
        ) from err
    if not frames.check_body(raw, body):
        raise ProtocolError(f"frame of type {h.type} fails its CRC")
    return h.type, body


async def send(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Write `data` and wait until the transport buffer drains."""
    writer.write(data)
    await writer.drain()


async def close(writer: asyncio.StreamWriter) -> None:
    """Close a connection, ignoring a peer that is already gone."""
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


def parse_record(body: bytes) -> LogRecord:
    """A RECORD frame body as a LogRecord (header decoded; CRC and chain are the store's).

    Raises ProtocolError when the body is not a log record.
    """
    if len(body) < LOG_HEADER.size:
        raise ProtocolError("RECORD frame shorter than a log header")
    try:
        h = decode_log_header(body[: LOG_HEADER.size])
    except ValueError as err:
        raise ProtocolError(f"bad log record header: {err}") from err
    payload = body[LOG_HEADER.size :]
    if len(payload) != h.plen:
        raise ProtocolError("log record payload length does not match its header")
    return LogRecord(
        h.first_seq, h.num_entries, h.time_us, h.hash_head, body[: LOG_HEADER.size], payload
    )


def parse_record_view(body: bytes | bytearray) -> LogRecord:
    """`parse_record` of a body held in a bytearray (`FrameReader`): one copy of the
    payload into the record, none of the whole body."""
    if len(body) < LOG_HEADER.size:
        raise ProtocolError("RECORD frame shorter than a log header")
    mv = memoryview(body)
    header = bytes(mv[: LOG_HEADER.size])
    try:
        h = decode_log_header(header)
    except ValueError as err:
        raise ProtocolError(f"bad log record header: {err}") from err
    if len(body) - LOG_HEADER.size != h.plen:
        raise ProtocolError("log record payload length does not match its header")
    payload = bytes(mv[LOG_HEADER.size :])
    return LogRecord(h.first_seq, h.num_entries, h.time_us, h.hash_head, header, payload)


#: Bodies at least this large are received straight into their own buffer; smaller ones
#: (heartbeats, small records) are cut out of the scratch buffer, many per system call.
DIRECT_MIN = 16 << 10
SCRATCH = 256 << 10


class FrameReader(asyncio.BufferedProtocol):
    """Frames from a transport, read without a stream buffer in between.

    Install with `take_over` once the handshake is done. Complete frames queue up to
    `limit` bytes; beyond that the transport stops reading (TCP pushes back on the source)
    until `read_frame` takes some. Frame headers are checked (type, bound) as soon as they
    arrive, before the body's buffer is allocated; CRCs when the frame is read.
    """

    def __init__(self, limit: int, old: asyncio.BaseProtocol | None = None) -> None:
        self._limit = limit
        #: The stream protocol the transport had: it keeps its writer's flow control.
        self._old = old
        self._transport: Any = None
        self._scratch = bytearray(SCRATCH)
        self._scratch_view = memoryview(self._scratch)
        self._start = 0  # unread bytes of the scratch buffer are [_start:_end]
        self._end = 0
        self._header: bytes | None = None  # of the frame whose body is being received
        self._body = bytearray()
        self._got = 0
        self._direct = False
        self._frames: collections.deque[tuple[bytes, bytearray]] = collections.deque()
        self._queued = 0
        self._paused = False
        self._eof = False
        self._error: ProtocolError | None = None
        self._waiter: asyncio.Future[None] | None = None
        #: Whether the last RECORD frame read holds a log record whose own CRC holds too
        #: (checked with the frame's CRC in one pass over the payload; see `read_frame`).
        self.record_crc_ok = False
        #: The header flags of the last frame read.
        self.last_flags = 0

    # -- protocol side (called by the transport) --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._header is not None and self._start == self._end:
            left = len(self._body) - self._got
            if left >= DIRECT_MIN:
                self._direct = True
                return memoryview(self._body)[self._got :]
        self._direct = False
        if self._start == self._end or self._error is not None:
            self._start = self._end = 0  # after an error, bytes still arriving are dropped
        elif len(self._scratch) - self._end < 4096:
            n = self._end - self._start
            self._scratch[:n] = self._scratch[self._start : self._end]
            self._start, self._end = 0, n
        return self._scratch_view[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._direct:
            self._got += nbytes
            if self._got == len(self._body):
                self._complete()
        else:
            self._end += nbytes
            self._parse()
        self._wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        if self._old is not None:
            self._old.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._old is not None:
            self._old.pause_writing()

    def resume_writing(self) -> None:
        if self._old is not None:
            self._old.resume_writing()

    def feed(self, data: bytes) -> None:
        """Parse `data` as if the transport had received it."""
        mv = memoryview(data)
        while mv and self._error is None:
            view = self.get_buffer(len(mv))
            n = min(len(view), len(mv))
            view[:n] = mv[:n]
            self.buffer_updated(n)
            mv = mv[n:]

    def _parse(self) -> None:
        buf, view = self._scratch, self._scratch_view
        while self._error is None:
            avail = self._end - self._start
            if self._header is None:
                if avail < frames.HEADER_SIZE:
                    return
                raw = bytes(buf[self._start : self._start + frames.HEADER_SIZE])
                self._start += frames.HEADER_SIZE
                try:
                    h = frames.decode_header(raw, None)
                except ValueError as err:
                    self._error = ProtocolError(f"bad frame header: {err}")
                    self._transport.pause_reading()
                    return
                self._header = raw
                self._body = bytearray(h.length)
                self._got = 0
                if not h.length:
                    self._complete()
                continue
            if not avail:
                return
            n = min(avail, len(self._body) - self._got)
            self._body[self._got : self._got + n] = view[self._start : self._start + n]
            self._start += n
            self._got += n
            if self._got == len(self._body):
                self._complete()

    def _complete(self) -> None:
        assert self._header is not None
        self._frames.append((self._header, self._body))
        self._queued += len(self._body) + frames.HEADER_SIZE
        self._header, self._body, self._got = None, bytearray(), 0
        if self._queued >= self._limit and not self._paused:
            self._paused = True
            self._transport.pause_reading()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # -- consumer side --

    def feed_eof(self) -> None:
        """End the stream here: the next `read_frame` with nothing queued raises (the
        session ends), as `StreamReader.feed_eof` does for `read_frame`."""
        self._eof = True
        self._wake()

    async def read_frame(self) -> tuple[int, bytearray]:
        """The next frame as (type, body); ProtocolError as `read_frame` raises it."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            if self._eof:
                if self._header is not None:
                    raise ProtocolError(
                        f"frame truncated: got {self._got} of {len(self._body)} body bytes"
                    )
                raise ProtocolError("connection closed by the peer")
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        raw, body = self._frames.popleft()
        self._queued -= len(body) + frames.HEADER_SIZE
        if self._paused and self._queued < self._limit // 2:
            self._paused = False
            self._transport.resume_reading()
        want = frames.HEADER.unpack(raw)[3]
        self.record_crc_ok = False
        self.last_flags = raw[1]
        if raw[0] == frames.RECORD and len(body) >= LOG_HEADER.size:
            # A record is covered by two CRCs sharing its payload: the frame's (prefix,
            # log header, payload) and the log record's (58 header bytes, payload). The
            # payload's CRC is computed once and combined with each prefix's.
            mv = memoryview(body)
            hs = LOG_HEADER.size
            plen = len(body) - hs
            cp = codec.crc32(mv[hs:])
            if codec.crc32_combine(zlib.crc32(mv[:hs], zlib.crc32(raw[:6])), cp, plen) != want:
                raise ProtocolError(f"frame of type {raw[0]} fails its CRC")
            log_crc = int.from_bytes(mv[hs - 4 : hs], "little")
            self.record_crc_ok = codec.crc32_combine(zlib.crc32(mv[: hs - 4]), cp, plen) == log_crc
        elif zlib.crc32(body, zlib.crc32(raw[:6])) != want:
            raise ProtocolError(f"frame of type {raw[0]} fails its CRC")
        return raw[0], body


def take_over(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: int
) -> FrameReader:
    """Move the connection of (`reader`, `writer`) onto a new `FrameReader`: bytes the
    StreamReader already holds are parsed first; `writer` keeps working (its drain sees
    the transport's flow control through the reader)."""
    transport: Any = writer.transport  # a ReadTransport too (a socket or TLS one)
    fr = FrameReader(limit, transport.get_protocol())
    held = bytes(getattr(reader, "_buffer", b""))  # received after the handshake frame
    fr.connection_made(transport)
    transport.set_protocol(fr)
    transport.resume_reading()  # in case the stream reader had paused it (a no-op else)
    fr.feed(held)
    if reader.at_eof() or getattr(reader, "_eof", False):
        fr.feed_eof()
    return fr
