"""`wire.FrameReader` (the replica's stream reader) agrees with `wire.read_frame` over an
`asyncio.StreamReader` on any byte stream cut anywhere: the same frames, and a
ProtocolError exactly where the stream reader raises one; it pushes back (pauses the
transport) past its byte limit and resumes when drained."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ProtocolError
from replicator import frames, wire
from store.format import encode_log_header, log_crc_ok


class FakeTransport:
    """What a FrameReader calls on its transport: reading paused or not."""

    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False


def _deliver(fr: wire.FrameReader, data: bytes, cuts: list[int]) -> None:
    """Hand `data` to `fr` the way a transport does: into the buffers it offers, in
    pieces no longer than each cut (and the buffer) allow."""
    mv = memoryview(data)
    floor = len(data) // 300  # at most a few hundred pieces: small cuts, big bodies
    i = 0
    while mv:
        want = max(1, floor, cuts[i % len(cuts)]) if cuts else len(mv)
        i += 1
        buf = fr.get_buffer(-1)
        n = min(len(buf), len(mv), want)
        buf[:n] = mv[:n]
        fr.buffer_updated(n)
        mv = mv[n:]


async def _with_frame_reader(data: bytes, cuts: list[int], limit: int) -> list[Any]:
    fr = wire.FrameReader(limit)
    t = FakeTransport()
    fr.connection_made(t)  # type: ignore[arg-type]
    _deliver(fr, data, cuts)
    fr.eof_received()
    out: list[Any] = []
    while True:
        try:
            ftype, body = await fr.read_frame()
        except ProtocolError as err:
            out.append(("error", "closed" if "closed by the peer" in str(err) else "bad"))
            return out
        out.append((ftype, bytes(body)))


async def _with_stream_reader(data: bytes) -> list[Any]:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    out: list[Any] = []
    while True:
        try:
            out.append(await wire.read_frame(r))
        except ProtocolError as err:
            out.append(("error", "closed" if "closed by the peer" in str(err) else "bad"))
            return out


BODY = st.one_of(
    st.binary(max_size=64),
    st.integers(min_value=0, max_value=100_000).map(lambda n: bytes([n % 251]) * n),
)


@settings(max_examples=100, deadline=None)
@given(
    bodies=st.lists(
        st.tuples(st.sampled_from([frames.RECORD, frames.HEARTBEAT]), BODY), max_size=6
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=70_000), max_size=8),
    flip=st.none() | st.integers(min_value=0),
    cut_end=st.integers(min_value=0, max_value=30),
)
def test_agrees_with_the_stream_reader(
    bodies: list[tuple[int, bytes]], cuts: list[int], flip: int | None, cut_end: int
) -> None:
    data = b"".join(frames.encode_frame(t, b) for t, b in bodies)
    if flip is not None and data:
        i = flip % len(data)
        data = data[:i] + bytes([data[i] ^ 0x41]) + data[i + 1 :]
    data = data[: max(0, len(data) - cut_end)]
    want = asyncio.run(_with_stream_reader(data))
    got = asyncio.run(_with_frame_reader(data, cuts, limit=1 << 30))
    assert got == want


def test_pauses_past_its_limit_and_resumes_when_drained() -> None:
    async def main() -> None:
        fr = wire.FrameReader(limit=100_000)
        t = FakeTransport()
        fr.connection_made(t)  # type: ignore[arg-type]
        body = b"x" * 40_000
        _deliver(fr, frames.encode_frame(frames.RECORD, body) * 3, [])
        assert t.paused  # 120 kB queued > 100 kB
        assert (await fr.read_frame())[1] == body
        assert t.paused  # 80 kB: still above half the limit
        assert (await fr.read_frame())[1] == body
        assert not t.paused
        fr.feed_eof()
        assert (await fr.read_frame())[1] == body
        with pytest.raises(ProtocolError, match="closed"):
            await fr.read_frame()

    asyncio.run(main())


def test_a_bad_header_is_refused_before_its_body() -> None:
    async def main() -> None:
        fr = wire.FrameReader(limit=1 << 20)
        t = FakeTransport()
        fr.connection_made(t)  # type: ignore[arg-type]
        claim = frames.HEADER.pack(frames.HEARTBEAT, 0, 200 << 20, 0)  # over its bound
        _deliver(fr, claim, [])
        assert t.paused  # stops reading at the header: the body is never buffered
        with pytest.raises(ProtocolError, match="bad frame header"):
            await fr.read_frame()

    asyncio.run(main())


def test_takes_over_a_live_connection_after_the_handshake() -> None:
    """Bytes the stream reader already holds are not lost; the writer keeps working."""

    async def main() -> None:
        got: list[bytes] = []
        done = asyncio.Event()
        big = b"r" * 300_000

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            # the handshake frame and the first records in one write
            w.write(
                frames.encode_frame(frames.WELCOME, b"w") + frames.encode_frame(frames.RECORD, b"a")
            )
            await w.drain()
            got.append(await r.readexactly(5))  # what the client writes after the takeover
            w.write(frames.encode_frame(frames.RECORD, big) + frames.encode_end(9))
            await w.drain()
            await done.wait()
            w.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert (await wire.read_frame(reader)) == (frames.WELCOME, b"w")
        await asyncio.sleep(0.05)  # the first record is now in the stream reader's buffer
        fr = wire.take_over(reader, writer, 1 << 20)
        writer.write(b"hello")
        await writer.drain()
        assert (await fr.read_frame()) == (frames.RECORD, bytearray(b"a"))
        assert (await fr.read_frame()) == (frames.RECORD, bytearray(big))
        assert (await fr.read_frame())[0] == frames.END
        assert got == [b"hello"]
        done.set()
        with pytest.raises(ProtocolError, match="closed"):
            await fr.read_frame()
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


@settings(max_examples=60, deadline=None)
@given(payload=st.binary(max_size=50_000), flip=st.none() | st.integers(min_value=0))
def test_a_record_s_own_crc_is_checked_in_the_same_pass(payload: bytes, flip: int | None) -> None:
    """`record_crc_ok` says whether the log record's CRC holds, for a frame whose own CRC
    holds (a record corrupted at the source is framed correctly: only the store's check
    would catch it, and it does, because the flag is then False)."""
    header = encode_log_header(0, 1, 1, 5, b"\x07" * 32, payload)
    if flip is not None:
        i = flip % (58 + len(payload))
        rec = bytearray(header[:58] + payload)
        rec[i] ^= 0x10
        header, payload = bytes(rec[:58]) + header[58:], bytes(rec[58:])

    async def main() -> bool:
        fr = wire.FrameReader(limit=1 << 30)
        fr.connection_made(FakeTransport())  # type: ignore[arg-type]
        _deliver(fr, frames.encode_record(header, payload), [])
        ftype, body = await fr.read_frame()
        assert (ftype, bytes(body)) == (frames.RECORD, header + payload)
        return fr.record_crc_ok

    try:
        holds = log_crc_ok(header, payload)
    except ValueError:  # the flip hit the header's tag: not a log record at all
        holds = False
    assert asyncio.run(main()) is holds
    assert holds is (flip is None)
