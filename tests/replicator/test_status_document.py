"""The status document the worker rewrites in place (`replicator/status.py`): what a reader
gets is a whole document or nothing — never a mix of two — whatever it reads during a write,
after a longer document, or from an earlier release's plain JSON."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from replicator.status import (
    StatusBoard,
    decode_document,
    encode_document,
    read_status,
    status_path,
)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@given(st.dictionaries(st.text(max_size=12), _json, max_size=8), st.integers(0, 2000))
def test_a_document_reads_back_whatever_it_holds_and_however_it_is_padded(
    doc: dict[str, Any], pad: int
) -> None:
    raw = encode_document(doc, pad)
    assert len(raw) >= pad
    assert decode_document(raw) == doc


@given(st.dictionaries(st.text(max_size=12), _json, min_size=1, max_size=8), st.data())
def test_a_document_with_any_byte_changed_reads_as_nothing_or_itself(
    doc: dict[str, Any], data: st.DataObject
) -> None:
    """A read torn by a write differs from the document in some bytes: the CRC line turns
    every change of the JSON line or of the CRC itself into None."""
    raw = bytearray(encode_document(doc))
    i = data.draw(st.integers(0, raw.index(b"\n", raw.index(b"\n") + 1) - 1))
    raw[i] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    got = decode_document(bytes(raw))
    assert got is None or got == doc


def test_an_earlier_releases_plain_json_is_read(tmp_path: Path) -> None:
    with open(status_path(str(tmp_path)), "w") as f:
        json.dump({"pid": 7, "state": "streaming", "applied_seq": 9}, f, indent=2)
    st_ = read_status(str(tmp_path))
    assert st_ is not None and st_.applied_seq == 9


def test_a_torn_document_reads_as_none(tmp_path: Path) -> None:
    line = b'{"pid":7,"applied_seq":9}'
    Path(status_path(str(tmp_path))).write_bytes(line + b"\n00000000\n")
    assert read_status(str(tmp_path)) is None


def test_a_shorter_document_after_a_longer_one_reads_as_itself(tmp_path: Path) -> None:
    board = StatusBoard(str(tmp_path))
    board.update(error="x" * 5000, applied_seq=1)
    board.flush()
    board.update(error=None, applied_seq=2)
    board.flush()
    got = read_status(str(tmp_path))
    assert got is not None and got.error is None and got.applied_seq == 2
    assert os.path.getsize(status_path(str(tmp_path))) > 5000  # padded, not truncated
    board.close()


def test_a_removed_document_is_written_again(tmp_path: Path) -> None:
    board = StatusBoard(str(tmp_path))
    board.update(applied_seq=1)
    board.flush()
    os.unlink(status_path(str(tmp_path)))
    board.update(applied_seq=2)
    board.flush()
    got = read_status(str(tmp_path))
    assert got is not None and got.applied_seq == 2
    board.close()


def test_reads_during_writes_see_whole_documents(tmp_path: Path) -> None:
    """A writer thread rewrites the document as fast as it can, its length changing each
    time; every read answers a document whose fields were written together."""
    board = StatusBoard(str(tmp_path))
    board.flush()
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            board.update(applied_seq=i, applied_records=i, error="e" * (i % 300))
            board.flush()

    t = threading.Thread(target=write)
    t.start()
    seen = 0
    try:
        for _ in range(3000):
            got = read_status(str(tmp_path))
            if got is not None:
                seen += 1
                assert got.applied_records == got.applied_seq
                assert got.error is None or len(got.error) == got.applied_seq % 300
    finally:
        stop.set()
        t.join(10)
        board.close()
    assert seen > 0
