"""The replication wire format: golden bytes, round trips, corruption detection."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ProtocolError
from replicator import frames, wire

DATA = Path(__file__).resolve().parents[1] / "data"

HELLO = frames.Hello(
    frames.PROTOCOL_VERSION,
    frames.MODE_STREAM,
    frames.OPT_NEWEST_ONLY,
    bytes(range(16)),
    bytes(range(16, 32)),
    41,
    100,
    0,
    frames.ZERO_SHA,
)
WELCOME = frames.Welcome(frames.PROTOCOL_VERSION, b"\x01" * 16, b"\x02" * 16, 1000, 5, 1000)
HEARTBEAT = frames.Heartbeat(1_700_000_000_000_000, 1234, 1000, 1200)
OFFER = frames.SnapshotOffer(77, b"\x03" * 32, b"\x04" * 16, 1 << 20, b"\x05" * 32, 4096)


def golden_frames() -> dict[str, bytes]:
    """One frame of every type, with fixed content."""
    return {
        "hello": frames.encode_hello(HELLO),
        "welcome": frames.encode_welcome(WELCOME),
        "refuse": frames.encode_refuse(frames.REFUSE_DB_ID, "db id mismatch"),
        "record": frames.encode_record(b"\x01" + b"\x00" * 61, b"payload"),
        "heartbeat": frames.encode_heartbeat(HEARTBEAT),
        "snapshot": frames.encode_snapshot(OFFER),
        "wait": frames.encode_wait(3),
        "end": frames.encode_end(99),
    }


@pytest.mark.parametrize("name", sorted(golden_frames()))
def test_frame_bytes_match_golden_file(name: str) -> None:
    golden = (DATA / f"repl_{name}.bin").read_bytes()
    assert golden_frames()[name] == golden, (
        f"wire bytes of {name} drifted: bump frames.PROTOCOL_VERSION and regenerate "
        "tests/data/repl_*.bin on purpose"
    )


def test_bodies_round_trip() -> None:
    def body(frame: bytes) -> bytes:
        return frame[frames.HEADER_SIZE :]

    assert frames.decode_hello(body(frames.encode_hello(HELLO))) == HELLO
    assert frames.decode_hello(body(frames.encode_hello(HELLO))).newest_only
    assert frames.decode_welcome(body(frames.encode_welcome(WELCOME))) == WELCOME
    assert frames.decode_heartbeat(body(frames.encode_heartbeat(HEARTBEAT))) == HEARTBEAT
    assert frames.decode_snapshot(body(frames.encode_snapshot(OFFER))) == OFFER
    assert frames.decode_refuse(body(frames.encode_refuse(2, "self"))) == frames.Refuse(2, "self")
    assert frames.decode_wait(body(frames.encode_wait(7))) == 7
    assert frames.decode_end(body(frames.encode_end(8))) == 8


async def _read_all(data: bytes) -> list[tuple[int, bytes]]:
    r = asyncio.StreamReader()
    r.feed_data(data)
    r.feed_eof()
    out = []
    while True:
        try:
            out.append(await wire.read_frame(r))
        except ProtocolError as err:
            if "closed by the peer" in str(err):
                return out
            raise


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=400))
def test_any_single_byte_flip_is_detected(body: bytes, where: int) -> None:
    frame = frames.encode_frame(frames.RECORD, body)
    assert asyncio.run(_read_all(frame)) == [(frames.RECORD, body)]
    i = where % len(frame)
    bad = frame[:i] + bytes([frame[i] ^ 0x5A]) + frame[i + 1 :]
    with pytest.raises(ProtocolError):
        asyncio.run(_read_all(bad))


def test_truncated_frame_is_detected() -> None:
    frame = frames.encode_frame(frames.RECORD, b"x" * 100)
    with pytest.raises(ProtocolError, match="truncated"):
        asyncio.run(_read_all(frame[:50]))


def test_oversized_length_is_refused_before_reading() -> None:
    raw = frames.HEADER.pack(frames.RECORD, 0, frames.MAX_BODY + 1, 0)
    with pytest.raises(ProtocolError, match="exceeds"):
        asyncio.run(_read_all(raw))


U64 = st.integers(min_value=0, max_value=2**64 - 1)
ID = st.binary(min_size=16, max_size=16)


@given(
    st.sampled_from([frames.MODE_STREAM, frames.MODE_SNAPSHOT]),
    st.integers(0, 255),
    ID,
    ID,
    U64,
    U64,
    U64,
    st.binary(min_size=32, max_size=32),
)
def test_hello_round_trips_any_field_values(mode, options, cid, dbid, last, stop, off, sha):
    h = frames.Hello(frames.PROTOCOL_VERSION, mode, options, cid, dbid, last, stop, off, sha)
    frame = frames.encode_hello(h)
    assert frames.decode_hello(frame[frames.HEADER_SIZE :]) == h
    assert asyncio.run(_read_all(frame)) == [(frames.HELLO, frame[frames.HEADER_SIZE :])]


@given(U64, U64, st.integers(0, 2**32 - 1), U64)
def test_heartbeat_round_trips_any_field_values(t, seq, interval, sent):
    hb = frames.Heartbeat(t, seq, interval, sent)
    assert frames.decode_heartbeat(frames.encode_heartbeat(hb)[frames.HEADER_SIZE :]) == hb


@given(U64, U64, st.integers(0, 2**32 - 1), U64, st.binary(min_size=32, max_size=32))
def test_heartbeat_with_a_head_round_trips_in_60_bytes(t, seq, interval, sent, head):
    hb = frames.Heartbeat(t, seq, interval, sent, head)
    body = frames.encode_heartbeat(hb, with_head=True)[frames.HEADER_SIZE :]
    assert len(body) == 60 <= frames.MAX_BODY_OF[frames.HEARTBEAT]
    want = hb if head != frames.ZERO_SHA else hb._replace(head=None)
    assert frames.decode_heartbeat(body) == want


def test_a_heartbeat_without_with_head_is_the_old_28_bytes_whatever_it_holds() -> None:
    # A client that did not ask for heads (an older one) must get exactly the old frame.
    hb = HEARTBEAT._replace(head=b"\x07" * 32)
    assert frames.encode_heartbeat(hb) == (DATA / "repl_heartbeat.bin").read_bytes()
    # Asked for, a head not known goes as all zero and decodes as None.
    body = frames.encode_heartbeat(HEARTBEAT, with_head=True)[frames.HEADER_SIZE :]
    assert body[28:] == frames.ZERO_SHA and frames.decode_heartbeat(body) == HEARTBEAT
    for n in (0, 27, 29, 59, 61):
        with pytest.raises(ValueError):
            frames.decode_heartbeat(b"\x00" * n)


@given(U64, st.binary(min_size=32, max_size=32), st.text(max_size=5000))
def test_diverged_refusal_carries_its_evidence_and_fits_a_refuse(seq, head, why):
    message = frames.diverged_refusal(seq, head, why)
    assert len(message.encode()) <= frames.MAX_REFUSE_MESSAGE
    assert frames.diverged_evidence(message) == (seq, head)
    frame = frames.encode_refuse(frames.REFUSE_DIVERGED, message)
    assert frames.decode_refuse(frame[frames.HEADER_SIZE :]).message == message


def test_a_refusal_without_evidence_has_none() -> None:
    assert frames.diverged_evidence("source is shutting down") is None
    assert frames.diverged_evidence("abandoned history at seq 5 with hash head 00: x") is None
