"""Fuzz targets of the replication frame reader and decoders, in CI with a small budget:
random and mutated-valid byte streams, cut into random segments and read with
`wire.read_frame` from a real `asyncio.StreamReader`, yield frames or `ProtocolError` —
never anything else; body decoders raise only ValueError; the entry check every received
record meets (`store/replay.py`, which the store names as `InvalidRecordError`) raises only
ValueError."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ProtocolError
from replicator import frames, wire
from store import format as fmt
from store import replay
from tests.property.test_fuzz_listeners import mutated, segments

FUZZ = settings(max_examples=80, deadline=None)

HELLO = frames.Hello(1, 1, 0, b"\x01" * 16, b"\x02" * 16, 5, 0, 0, frames.ZERO_SHA)
VALID = [
    frames.encode_hello(HELLO),
    frames.encode_welcome(frames.Welcome(1, b"\x01" * 16, b"\x02" * 16, 9, 1, 1000)),
    frames.encode_refuse(frames.REFUSE_BOOTSTRAP, "history no longer retained"),
    frames.encode_record(b"\x01" + b"\x00" * 61, b"payload"),
    frames.encode_heartbeat(frames.Heartbeat(1, 2, 1000, 2)),
    frames.encode_snapshot(frames.SnapshotOffer(1, b"\x03" * 32, b"\x04" * 16, 9, b"\x05" * 32, 0)),
    frames.encode_wait(2),
    frames.encode_end(7),
]
DECODERS = {
    frames.HELLO: frames.decode_hello,
    frames.WELCOME: frames.decode_welcome,
    frames.REFUSE: frames.decode_refuse,
    frames.RECORD: wire.parse_record,
    frames.HEARTBEAT: frames.decode_heartbeat,
    frames.SNAPSHOT: frames.decode_snapshot,
    frames.WAIT: frames.decode_wait,
    frames.END: frames.decode_end,
}


async def _read_all(pieces: list[bytes], allowed: frozenset[int] | None) -> list[int]:
    reader = asyncio.StreamReader()
    for p in pieces:
        reader.feed_data(p)
    reader.feed_eof()
    got: list[int] = []
    while True:
        try:
            ftype, body = await wire.read_frame(reader, allowed)
        except ProtocolError:
            return got
        assert len(body) <= frames.MAX_BODY_OF[ftype]
        with contextlib.suppress(ValueError, ProtocolError):
            DECODERS[ftype](body)
        got.append(ftype)


@FUZZ
@given(
    st.one_of(st.binary(max_size=300), mutated(VALID)),
    st.lists(st.integers(0, 1 << 16), max_size=6),
    st.sampled_from([None, frozenset({frames.HELLO}), frozenset({frames.RECORD, frames.END})]),
)
def test_frame_reader_yields_frames_or_protocol_error(
    data: bytes, cuts: list[int], allowed: frozenset[int] | None
) -> None:
    got = asyncio.run(_read_all(segments(data, cuts), allowed))
    if allowed is not None:
        assert set(got) <= allowed


@FUZZ
@given(st.sampled_from(sorted(frames.TYPES)), st.integers(0, 2**32 - 1))
def test_a_header_claiming_more_than_its_type_allows_is_refused(ftype: int, length: int) -> None:
    raw = frames.HEADER.pack(ftype, 0, length, 0)
    try:
        h = frames.decode_header(raw)
    except ValueError:
        assert length > frames.MAX_BODY_OF[ftype]
    else:
        assert h.length == length <= frames.MAX_BODY_OF[ftype]


ENTRIES = st.lists(
    st.tuples(
        st.sampled_from([fmt.OP_SET, fmt.OP_DELETE]),
        st.binary(max_size=4),
        st.binary(min_size=1, max_size=20),
        st.binary(max_size=20),
    ),
    min_size=1,
    max_size=5,
)


@FUZZ
@given(ENTRIES, st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=4))
def test_record_validation_accepts_valid_entries_and_names_every_bad_one(
    ops: list[tuple[int, bytes, bytes, bytes]], flips: list[tuple[int, int]]
) -> None:
    ops = [(op, o, k, b"" if op == fmt.OP_DELETE else v) for op, o, k, v in ops]
    payload, head = fmt.pack_entries(10, ops, fmt.ZERO_HASH)
    assert replay.scan_entries(payload, fmt.ZERO_HASH, 10, len(ops)) == head
    raw = bytearray(payload)
    for i, b in flips:
        raw[i % len(raw)] = b
    try:
        replay.scan_entries(bytes(raw), fmt.ZERO_HASH, 10, len(ops))
    except ValueError as err:
        assert "entr" in str(err)  # names the entry (or the count) it refuses
