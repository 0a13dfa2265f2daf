"""The per-segment hot path of a listener connection (`net/tcp.py`), pure-Python reference.

Every segment a KT or memcached connection receives enters through `data_received`. The
common case — a keep-alive client's one whole request arriving on an idle connection — is
answered right here by the session's shortcut (`net.tcp.Fast`, e.g. memcached's lone
`get`) and written in one call; everything else goes to `received_more`, the connection's
full path with its buffer, run generator, turns and bounds. `net/_fastconn.pyx` compiles
this class (uvloop then calls a C method per segment, with no Python frame in between);
`tests/property/test_fastconn_agree.py` checks the two do the same.

A subclass (`net.tcp._Conn`) sets the attributes and implements `received_more` and
`fast_failed`.
"""

from __future__ import annotations

import time
from typing import Any

from core import compiled


class ConnBase:
    """What `data_received` reads and writes of a connection (see the module docstring).

    `transport` (None until connected and after loss), `fast` (the session's shortcut or
    None), `work` (the run generator while a request is being worked on), `buf` (bytes of
    requests not answered yet), `active_at` (`time.monotonic()` of the last byte received
    or request answered: the idle timeout's clock), `received` (bytes received in all)."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.fast: Any = None
        self.work: Any = None
        self.buf = bytearray()
        self.active_at = 0.0
        self.received = 0

    def data_received(self, data: bytes) -> None:
        t = self.transport
        if t is None or t.is_closing():
            return
        self.active_at = time.monotonic()
        self.received += len(data)
        fast = self.fast
        if fast is not None and self.work is None and not self.buf:
            try:
                reply = fast(data)
            except Exception:
                self.fast_failed()
                return
            if reply is not None:
                t.write(reply)
                return
        self.received_more(data)

    def received_more(self, data: bytes) -> None:
        """`data` for the full path (buffer, run, bounds)."""
        raise NotImplementedError

    def fast_failed(self) -> None:
        """The shortcut raised (a bug): log it and close this connection (called inside
        the `except` block, so the exception is current)."""
        raise NotImplementedError


def _load() -> type[ConnBase]:
    """The compiled class, or the reference where it serves (`core/compiled.py`)."""
    built = compiled.load("net._fastconn")
    return ConnBase if built is None else built.ConnBase


#: The base `net.tcp` connections derive from: compiled when built, else the reference.
BASE: type[ConnBase] = _load()
