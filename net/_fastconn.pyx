# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled `net/fastconn.py` (the reference, which documents it): a listener
connection's `data_received`, answering a whole request on an idle connection through the
session's shortcut without a Python frame. `tests/property/test_fastconn_agree.py` checks
the two do the same."""

from cpython.bytearray cimport PyByteArray_GET_SIZE
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline double _monotonic() noexcept nogil:
    # time.monotonic's clock on Linux
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef class ConnBase:
    """See `net.fastconn.ConnBase`."""

    cdef public object transport, fast, work
    cdef public bytearray buf
    cdef public double active_at
    cdef public long long received

    def __init__(self):
        self.transport = None
        self.fast = None
        self.work = None
        self.buf = bytearray()
        self.active_at = 0.0
        self.received = 0

    def data_received(self, data):
        t = self.transport
        if t is None or t.is_closing():
            return
        self.active_at = _monotonic()
        self.received += len(data)
        fast = self.fast
        if fast is not None and self.work is None and PyByteArray_GET_SIZE(self.buf) == 0:
            try:
                reply = fast(data)
            except Exception:
                self.fast_failed()
                return
            if reply is not None:
                t.write(reply)
                return
        self.received_more(data)

    def received_more(self, data):
        raise NotImplementedError

    def fast_failed(self):
        raise NotImplementedError
