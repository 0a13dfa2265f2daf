"""Reading and writing frames on asyncio streams (the thin I/O adapter of `frames`)."""

from __future__ import annotations

import asyncio
import contextlib

from core.errors import ProtocolError
from replicator import frames
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
