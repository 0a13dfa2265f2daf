"""A listener connection's compiled `data_received` (`net/_fastconn.pyx`) does what the
pure-Python reference (`net/fastconn.py`) does: for any sequence of segments and
connection states (busy with a request, bytes buffered, closing, no transport, no
shortcut, a shortcut answering, declining or raising), the same replies written, the same
segments handed to the full path, the same failures reported and bytes counted. The real
listeners run on both in `tests/reads` (the pure pass with MERCURY_PURE=1)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from net import fastconn

try:
    from net import _fastconn as cy  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - `make build` builds it
    pytest.skip("net._fastconn is not built (make build)", allow_module_level=True)


class Transport:
    """Records what the connection writes (the transport's surface it uses)."""

    def __init__(self, log: list[Any]) -> None:
        self.log = log
        self.closing = False

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        self.log.append(("write", data))


def make(base: type[Any], log: list[Any]) -> Any:
    class Conn(base):  # type: ignore[misc]
        def received_more(self, data: bytes) -> None:
            log.append(("more", data))

        def fast_failed(self) -> None:
            log.append(("failed",))

    return Conn()


def shortcut(log: list[Any], how: str) -> Any:
    def fast(data: bytes) -> bytes | None:
        log.append(("fast", data))
        if how == "raise":
            raise ValueError("a bug")
        if how == "decline":
            return None
        return b"R:" + data

    return fast


step = st.tuples(
    st.binary(max_size=20),
    st.sampled_from(["answer", "answer", "decline", "raise", "none"]),
    st.booleans(),  # busy: a run generator is working
    st.booleans(),  # bytes buffered
    st.sampled_from(["open", "open", "open", "closing", "absent"]),
)


@given(st.lists(step, min_size=1, max_size=8))
def test_compiled_data_received_agrees(steps: list[tuple[bytes, str, bool, bool, str]]) -> None:
    logs: list[list[Any]] = []
    received: list[int] = []
    for base in (fastconn.ConnBase, cy.ConnBase):
        log: list[Any] = []
        conn = make(base, log)
        transport = Transport(log)
        for data, how, busy, buffered, state in steps:
            conn.transport = None if state == "absent" else transport
            transport.closing = state == "closing"
            conn.fast = None if how == "none" else shortcut(log, how)
            conn.work = iter(()) if busy else None
            conn.buf = bytearray(b"x" if buffered else b"")
            conn.active_at = 0.0
            conn.data_received(data)
            log.append(("active", conn.active_at > 0))
        logs.append(log)
        received.append(conn.received)
    assert logs[0] == logs[1]
    assert received[0] == received[1]
