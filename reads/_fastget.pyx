# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled `reads/fastget.py` (the reference, which documents the bytes): a point read's
reply straight from the stored record, CRC checked, in one allocation, and memcached's
lone `get` answered whole (`McGet`). Same names, same results;
`tests/property/test_fastget_agree.py` and `test_mcget_agree.py` prove them identical."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memchr, memcmp, memcpy
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from reads.fastobserve import FLUSH_EVERY

# CRC-32 from libdeflate (the same CRC as Python's zlib.crc32), as store/_codec.pyx does.
cdef extern from "libdeflate.h":
    uint32_t libdeflate_crc32(uint32_t crc, const void* buffer, size_t len) nogil

# store/format.py's record layout (tag, flags, seq u64, vlen u32, crc u32, owner length).
cdef enum:
    RECORD_TAG = 0x01
    FLAG_CHUNKED = 0x01
    RECORD_FIXED = 19

cdef const char* OCTET_HEAD = b"content-type: application/octet-stream\r\netag: "


cdef inline uint64_t _u64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(7, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline uint32_t _u32(const uint8_t* p) noexcept nogil:
    return p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline Py_ssize_t _inline(bytes key, bytes rec, uint64_t* seq) noexcept:
    """Offset of the value of an inline record whose CRC holds; -1 otherwise."""
    cdef Py_ssize_t n = PyBytes_GET_SIZE(rec)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(rec)
    # Any flag (a chunked value, a deadline whose `Expires` the full path reports): -1.
    if n < RECORD_FIXED or p[0] != RECORD_TAG or p[1] != 0:
        return -1
    cdef uint32_t vlen = _u32(p + 10)
    cdef Py_ssize_t off = RECORD_FIXED + p[18]
    if n != off + vlen:
        return -1
    cdef uint32_t crc = libdeflate_crc32(0, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
    crc = libdeflate_crc32(crc, p, 14)
    crc = libdeflate_crc32(crc, p + 18, n - 18)
    if crc != _u32(p + 14):
        return -1
    seq[0] = _u64(p + 2)
    return off


cdef inline int _put_uint(char* out, int at, uint64_t v) noexcept nogil:
    """Write " <v in decimal>" at `out + at` (as printf's " %llu"); the new end."""
    cdef char digits[20]
    cdef int n = 0
    while True:
        digits[n] = <char>(48 + v % 10)
        n += 1
        v //= 10
        if v == 0:
            break
    out[at] = 32
    at += 1
    while n:
        n -= 1
        out[at] = digits[n]
        at += 1
    return at


cdef object _mc_block(bytes key, bytes rec, bint with_cas, bint flags_in_value, bint end):
    """`VALUE` block of an inline record whose CRC holds (then `END` when `end`), or None."""
    cdef uint64_t seq
    cdef Py_ssize_t off = _inline(key, rec, &seq)
    if off < 0:
        return None
    cdef const uint8_t* v = <const uint8_t*>PyBytes_AS_STRING(rec) + off
    cdef Py_ssize_t vlen = PyBytes_GET_SIZE(rec) - off
    cdef uint32_t flags = 0
    if flags_in_value and vlen >= 4:
        flags = (<uint32_t>v[vlen - 4] << 24) | (<uint32_t>v[vlen - 3] << 16) | (
            <uint32_t>v[vlen - 2] << 8) | v[vlen - 1]
        vlen -= 4
    cdef char nums[96]
    cdef int m = _put_uint(nums, 0, flags)
    m = _put_uint(nums, m, <uint64_t>vlen)
    if with_cas:
        m = _put_uint(nums, m, seq)
    nums[m] = 13
    nums[m + 1] = 10
    m += 2
    cdef Py_ssize_t kn = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t tail = 7 if end else 2
    out = PyBytes_FromStringAndSize(NULL, 6 + kn + m + vlen + tail)
    cdef char* o = PyBytes_AS_STRING(out)
    memcpy(o, b"VALUE ", 6)
    memcpy(o + 6, PyBytes_AS_STRING(key), kn)
    memcpy(o + 6 + kn, nums, m)
    memcpy(o + 6 + kn + m, v, vlen)
    memcpy(o + 6 + kn + m + vlen, b"\r\nEND\r\n", tail)
    return out


def mc_value(bytes key, bytes rec, bint with_cas, bint flags_in_value):
    return _mc_block(key, rec, with_cas, flags_in_value, False)


def http_value(bytes head, bytes key, bytes rec, unsigned long long applied, bint head_only,
               bint close):
    cdef uint64_t seq
    cdef Py_ssize_t off = _inline(key, rec, &seq)
    if off < 0:
        return None
    cdef Py_ssize_t vlen = PyBytes_GET_SIZE(rec) - off
    cdef const char* tail = b"connection: close\r\n\r\n" if close else b"\r\n"
    cdef char mid[320]
    cdef int m = snprintf(
        mid, sizeof(mid),
        b"%s\"%llu\"\r\nx-mercury-version: %llu\r\nx-mercury-seq: %llu\r\n"
        b"x-mercury-applied-seq: %llu\r\ncontent-length: %zd\r\n%s",
        OCTET_HEAD, <unsigned long long>seq, <unsigned long long>seq, applied, applied, vlen,
        tail)
    cdef Py_ssize_t hn = PyBytes_GET_SIZE(head)
    cdef Py_ssize_t body = 0 if head_only else vlen
    out = PyBytes_FromStringAndSize(NULL, hn + m + body)
    cdef char* o = PyBytes_AS_STRING(out)
    memcpy(o, PyBytes_AS_STRING(head), hn)
    memcpy(o + hn, mid, m)
    if body:
        memcpy(o + hn + m, PyBytes_AS_STRING(rec) + off, body)
    return out


cdef bytes END = b"END\r\n"


cdef inline bint _space(uint8_t c) noexcept nogil:
    """ASCII whitespace as `bytes.split()` takes it (space, \\t \\n \\v \\f \\r)."""
    return c == 32 or 9 <= c <= 13


cdef inline double _now() noexcept nogil:
    # time.perf_counter's clock on Linux
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef class McGet:
    """See `reads.fastget.McGet` (the reference)."""

    cdef object env, db, fallback, observe, note_read
    cdef object __weakref__  # observe.sources holds it weakly
    cdef bint flags_in_value
    cdef Py_ssize_t max_key, max_line
    cdef readonly unsigned long long cmd_get, get_hits, get_misses
    # The histogram's bucket bounds (from `observe`) and the latency counts not yet folded
    # into it (`fold`): a value costs a bisect and an increment, no Python object.
    cdef double* bounds
    cdef unsigned long long* counts
    cdef Py_ssize_t nbounds, pending, flush_every
    cdef double total

    def __cinit__(self):
        self.bounds = NULL
        self.counts = NULL

    def __init__(self, env, db, bint flags_in_value, fallback, observe, note_read,
                 Py_ssize_t max_key, Py_ssize_t max_line):
        self.env, self.db, self.flags_in_value = env, db, flags_in_value
        self.fallback, self.observe, self.note_read = fallback, observe, note_read
        self.max_key, self.max_line = max_key, max_line
        bounds = [float(b) for b in observe.bounds]
        if not bounds or bounds[len(bounds) - 1] != float("inf"):
            raise ValueError("a histogram's last bucket bound is +Inf")
        self.nbounds = len(bounds)
        free(self.bounds)
        free(self.counts)
        self.bounds = <double*>malloc(self.nbounds * sizeof(double))
        self.counts = <unsigned long long*>calloc(self.nbounds, sizeof(unsigned long long))
        if self.bounds == NULL or self.counts == NULL:
            raise MemoryError()
        cdef Py_ssize_t i
        for i in range(self.nbounds):
            self.bounds[i] = bounds[i]
        self.pending = 0
        self.total = 0.0
        self.flush_every = FLUSH_EVERY
        sources = getattr(observe, "sources", None)
        if sources is not None:
            sources.add(self)

    def __dealloc__(self):
        free(self.bounds)
        free(self.counts)

    cpdef Py_ssize_t bucket(self, double v):
        """The histogram bucket of `v`: the first whose upper bound is >= v (bisect_left)."""
        cdef Py_ssize_t lo = 0, hi = self.nbounds, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.bounds[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef int _observe(self, double v) except -1:
        self.counts[self.bucket(v)] += 1
        self.total += v
        self.pending += 1
        if self.pending >= self.flush_every:
            self.fold()
            self.observe.flush()
        return 0

    def fold(self):
        """Move the pending latency counts into `observe`'s (which its `flush` folds into
        the histogram; a `SourcedObserve` calls this first, so a scrape sees them)."""
        if not self.pending:
            return
        ob = self.observe
        counts = ob.counts
        cdef Py_ssize_t i
        for i in range(self.nbounds):
            if self.counts[i]:
                counts[i] += self.counts[i]
                self.counts[i] = 0
        ob.total += self.total
        ob.n += self.pending
        self.total = 0.0
        self.pending = 0

    def __call__(self, bytes data):
        cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
        cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
        cdef Py_ssize_t i, start, end
        cdef bint with_cas
        # memcached_protocol.lone_get, in C
        if n < 2 or n > self.max_line or p[n - 2] != 13 or p[n - 1] != 10:
            return self.fallback(data)
        if memchr(p, 10, n - 1) != NULL:
            return self.fallback(data)
        if n >= 4 and memcmp(p, b"get ", 4) == 0:
            i, with_cas = 4, False
        elif n >= 5 and memcmp(p, b"gets ", 5) == 0:
            i, with_cas = 5, True
        else:
            return self.fallback(data)
        end = n - 2
        while i < end and _space(p[i]):
            i += 1
        start = i
        while i < end and not _space(p[i]):
            i += 1
        if i == start or i - start > self.max_key:
            return self.fallback(data)
        cdef Py_ssize_t klen = i - start
        while i < end and _space(p[i]):
            i += 1
        if i != end:
            return self.fallback(data)  # several keys
        cdef double t0 = _now()
        cdef bytes key = PyBytes_FromStringAndSize(<const char*>p + start, klen)
        txn = self.env.begin(self.db)
        try:
            rec = txn.get(key)
        finally:
            txn.abort()
        self.cmd_get += 1
        if rec is None:
            self.get_misses += 1
            self._observe(_now() - t0)
            return END
        out = _mc_block(key, rec, with_cas, self.flags_in_value, True)
        if out is None:
            self.cmd_get -= 1  # the fallback answers and counts it
            return self.fallback(data)
        self.note_read(key)
        self.get_hits += 1
        self._observe(_now() - t0)
        return out


cdef enum:
    MAX_HTTP_HEAD = 8192


cdef inline bint _path_ok(uint8_t c) noexcept nogil:
    # fastget._PATH_OK: letters, digits, -._~!$&'()*+,;=:@/
    if (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122):
        return True
    return memchr(b"-._~!$&'()*+,;=:@/", c, 18) != NULL


cdef inline bint _name_ok(uint8_t c) noexcept nogil:
    return (48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122) or c == 45


cdef inline uint8_t _lower(uint8_t c) noexcept nogil:
    return c + 32 if 65 <= c <= 90 else c


cdef const char* _DECLINE[7]
_DECLINE[0] = b"content-length"
_DECLINE[1] = b"transfer-encoding"
_DECLINE[2] = b"expect"
_DECLINE[3] = b"upgrade"
_DECLINE[4] = b"if-none-match"
_DECLINE[5] = b"connection"
_DECLINE[6] = b"authorization"


cdef bint _declined(const uint8_t* name, Py_ssize_t n) noexcept nogil:
    cdef int i
    cdef Py_ssize_t j
    cdef const char* d
    for i in range(7):
        d = _DECLINE[i]
        j = 0
        while j < n and d[j] != 0 and _lower(name[j]) == <uint8_t>d[j]:
            j += 1
        if j == n and d[j] == 0:
            return True
    return False


def http_request(bytes data, Py_ssize_t max_key):
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t i, ks, ke, colon, line_end
    cdef bint head_only
    if n < 4 or n > MAX_HTTP_HEAD or memcmp(p + n - 4, b"\r\n\r\n", 4) != 0:
        return None
    # no earlier empty line (a second, pipelined request or a body after the head)
    for i in range(n - 4):
        if p[i] == 13 and memcmp(p + i, b"\r\n\r\n", 4) == 0:
            return None
    if n >= 11 and memcmp(p, b"GET /v1/kv/", 11) == 0:
        head_only, ks = False, 11
    elif n >= 12 and memcmp(p, b"HEAD /v1/kv/", 12) == 0:
        head_only, ks = True, 12
    else:
        return None
    i = ks
    while i < n and p[i] != 13:
        i += 1
    # the request line is p[0:i]; it ends with " HTTP/1.1"
    if i - ks < 10 or memcmp(p + i - 9, b" HTTP/1.1", 9) != 0:
        return None
    ke = i - 9
    if ke - ks > max_key:
        return None
    cdef Py_ssize_t j
    for j in range(ks, ke):
        if not _path_ok(p[j]):
            return None
    i += 2  # past the request line's CRLF (p[i] was CR; a lone CR fails below)
    if p[i - 1] != 10:
        return None
    while i < n - 2:  # header lines up to the final CRLF
        line_end = i
        while line_end < n and p[line_end] != 13:
            line_end += 1
        if line_end + 1 >= n or p[line_end + 1] != 10:
            return None
        colon = i
        while colon < line_end and p[colon] != 58:
            if not _name_ok(p[colon]):
                return None
            colon += 1
        if colon == i or colon == line_end or _declined(p + i, colon - i):
            return None
        for j in range(colon + 1, line_end):
            if not (32 <= p[j] < 127 or p[j] == 9):
                return None
        i = line_end + 2
    if i != n - 2:
        return None
    return PyBytes_FromStringAndSize(<const char*>p + ks, ke - ks), head_only


def http_get(env, data_db, meta_db, bytes seq_key, bytes head, bytes key, bint head_only):
    txn = env.begin(data_db)
    try:
        rec = txn.get(key)
        raw = txn.get(seq_key, None, meta_db)
    finally:
        txn.abort()
    if rec is None:
        return None
    if type(raw) is not bytes or PyBytes_GET_SIZE(raw) != 8:
        raise ValueError("the store's last seq is not a u64")
    return http_value(head, key, rec, _u64(<const uint8_t*>PyBytes_AS_STRING(raw)), head_only,
                      False)
