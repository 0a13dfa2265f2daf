# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled `reads/fastget.py` (the reference, which documents the bytes): a point read's
reply straight from the stored record, CRC checked, in one allocation. Same names, same
results; `tests/property/test_fastget_agree.py` proves the bytes identical."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.stdio cimport snprintf
from libc.string cimport memcpy

# CRC-32 from zlib (the function Python's zlib.crc32 wraps), as store/_codec.pyx does.
cdef extern from "zlib.h":
    unsigned long crc32_z(unsigned long crc, const unsigned char* buf, size_t len) nogil

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
    if n < RECORD_FIXED or p[0] != RECORD_TAG or p[1] & FLAG_CHUNKED:
        return -1
    cdef uint32_t vlen = _u32(p + 10)
    cdef Py_ssize_t off = RECORD_FIXED + p[18]
    if n != off + vlen:
        return -1
    cdef unsigned long crc = crc32_z(0, <const unsigned char*>PyBytes_AS_STRING(key),
                                     PyBytes_GET_SIZE(key))
    crc = crc32_z(crc, p, 14)
    crc = crc32_z(crc, p + 18, n - 18)
    if <uint32_t>crc != _u32(p + 14):
        return -1
    seq[0] = _u64(p + 2)
    return off


def mc_value(bytes key, bytes rec, bint with_cas, bint flags_in_value):
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
    cdef int m
    if with_cas:
        m = snprintf(nums, sizeof(nums), b" %u %zd %llu\r\n", flags, vlen,
                     <unsigned long long>seq)
    else:
        m = snprintf(nums, sizeof(nums), b" %u %zd\r\n", flags, vlen)
    cdef Py_ssize_t kn = PyBytes_GET_SIZE(key)
    out = PyBytes_FromStringAndSize(NULL, 6 + kn + m + vlen + 2)
    cdef char* o = PyBytes_AS_STRING(out)
    memcpy(o, b"VALUE ", 6)
    memcpy(o + 6, PyBytes_AS_STRING(key), kn)
    memcpy(o + 6 + kn, nums, m)
    memcpy(o + 6 + kn + m, v, vlen)
    memcpy(o + 6 + kn + m + vlen, b"\r\n", 2)
    return out


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
