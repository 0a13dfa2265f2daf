# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled decoder for the common shape of a JSON ``POST /v1/batch`` body.

``decode_json_ops`` turns ``{"ops": [{"op": "set", "key": "...", "value": "..."}, ...]}``
(and ``{"op": "delete", "key": "..."}``) straight into store ops, without building a dict
and three str objects per op. It is an accelerator, not a second parser with its own
rules: it accepts only a strict subset of JSON and answers ``None`` for anything else
(other fields, ``_b64`` fields, numbers, a byte it does not expect, a limit exceeded),
and the caller then runs the reference path (`gateway.bodies.parse_body` +
`gateway.bodies.batch_ops`), which either accepts the body or names the exact reason it
does not. `tests/property/test_jsonops_agree.py` proves: whenever this returns ops, they
equal the reference's.

Why it pays: the gateway is one process, and py-lmdb drops the GIL on every LMDB call, so
while the event loop runs Python the commit thread advances one put per switch interval.
The scan below runs without the GIL (bodies over `NOGIL_MIN` bytes), so the commit
thread keeps applying while a request is decoded; only the final object building holds it.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_INCREF
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp

from store.ops import DELETE, SET, Op

cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject* t, Py_ssize_t n)
    void PyTuple_SET_ITEM(object t, Py_ssize_t i, object o)  # steals a reference

cdef object _Op = Op
cdef object _NO_DEADLINE = 0
cdef object _SET = SET
cdef object _DELETE = DELETE

#: Bodies at least this long are scanned with the GIL released.
NOGIL_MIN = 16384

# 1 for the bytes a string's plain run stops at: quote, backslash, control bytes, non-ASCII.
cdef unsigned char _stop[256]


cdef void _init_stop():
    cdef int c
    for c in range(256):
        _stop[c] = 1 if (c < 0x20 or c >= 0x80 or c == 34 or c == 92) else 0


_init_stop()


cdef struct Span:
    Py_ssize_t ks      # key: offset of its first byte (after the quote) ...
    Py_ssize_t kn      # ... and its length in the body, escapes not yet decoded
    Py_ssize_t vs
    Py_ssize_t vn
    int kesc           # 1 when the key holds backslash escapes
    int vesc
    int kind           # 1 set, 2 delete


cdef inline Py_ssize_t _ws(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and (s[i] == 32 or s[i] == 10 or s[i] == 13 or s[i] == 9):
        i += 1
    return i


cdef inline int _hex4(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The value of 4 hex digits at s[i:i+4], or -1."""
    cdef int v = 0, k, c
    if i + 4 > n:
        return -1
    for k in range(4):
        c = s[i + k]
        if 48 <= c <= 57:
            v = v * 16 + c - 48
        elif 97 <= c <= 102:
            v = v * 16 + c - 87
        elif 65 <= c <= 70:
            v = v * 16 + c - 55
        else:
            return -1
    return v


cdef inline int _utf8_len(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Length of the well-formed UTF-8 sequence starting at s[i] (a byte >= 0x80), or -1
    (overlong forms, surrogates and code points past U+10FFFF are not well formed)."""
    cdef unsigned char c = s[i]
    cdef unsigned char lo = 0x80, hi = 0xBF
    cdef int k, need
    if 0xC2 <= c <= 0xDF:
        need = 1
    elif 0xE0 <= c <= 0xEF:
        need = 2
        if c == 0xE0:
            lo = 0xA0
        elif c == 0xED:
            hi = 0x9F
    elif 0xF0 <= c <= 0xF4:
        need = 3
        if c == 0xF0:
            lo = 0x90
        elif c == 0xF4:
            hi = 0x8F
    else:
        return -1
    if i + need >= n:
        return -1
    if s[i + 1] < lo or s[i + 1] > hi:
        return -1
    for k in range(2, need + 1):
        if s[i + k] < 0x80 or s[i + k] > 0xBF:
            return -1
    return need + 1


cdef Py_ssize_t _string_end(const unsigned char* s, Py_ssize_t i, Py_ssize_t n, int* esc) noexcept nogil:
    """Index of the closing quote of the string whose content starts at s[i], or -1 when
    it is not a string JSON (and orjson) accept: control bytes, bad escapes, lone
    surrogates, malformed UTF-8."""
    cdef unsigned char c
    cdef int cp, lo
    cdef int k
    while i < n:
        while i < n and not _stop[s[i]]:  # the plain run: most of every string
            i += 1
        if i >= n:
            return -1
        c = s[i]
        if c == 34:
            return i
        if c == 92:
            esc[0] = 1
            if i + 1 >= n:
                return -1
            c = s[i + 1]
            if c == 117:  # \uXXXX, a surrogate only as a high+low pair
                cp = _hex4(s, i + 2, n)
                if cp < 0 or 0xDC00 <= cp <= 0xDFFF:
                    return -1
                if 0xD800 <= cp <= 0xDBFF:
                    if i + 12 > n or s[i + 6] != 92 or s[i + 7] != 117:
                        return -1
                    lo = _hex4(s, i + 8, n)
                    if lo < 0xDC00 or lo > 0xDFFF:
                        return -1
                    i += 12
                else:
                    i += 6
            elif c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
                i += 2
            else:
                return -1
        elif c < 0x20:
            return -1
        else:
            k = _utf8_len(s, i, n)
            if k < 0:
                return -1
            i += k
    return -1


cdef Py_ssize_t _unescape(const unsigned char* s, Py_ssize_t n, unsigned char* out) noexcept nogil:
    """Decode the escapes of a string content already checked by `_string_end` into `out`
    (at least `n` bytes: decoding never grows a string); returns the decoded length."""
    cdef Py_ssize_t i = 0, o = 0
    cdef unsigned char c
    cdef unsigned int cp, lo
    while i < n:
        c = s[i]
        if c != 92:
            out[o] = c
            o += 1
            i += 1
            continue
        c = s[i + 1]
        if c == 117:
            cp = <unsigned int>_hex4(s, i + 2, n)
            i += 6
            if 0xD800 <= cp <= 0xDBFF:
                lo = <unsigned int>_hex4(s, i + 2, n)
                i += 6
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00)
            if cp < 0x80:
                out[o] = <unsigned char>cp
                o += 1
            elif cp < 0x800:
                out[o] = <unsigned char>(0xC0 | (cp >> 6))
                out[o + 1] = <unsigned char>(0x80 | (cp & 0x3F))
                o += 2
            elif cp < 0x10000:
                out[o] = <unsigned char>(0xE0 | (cp >> 12))
                out[o + 1] = <unsigned char>(0x80 | ((cp >> 6) & 0x3F))
                out[o + 2] = <unsigned char>(0x80 | (cp & 0x3F))
                o += 3
            else:
                out[o] = <unsigned char>(0xF0 | (cp >> 18))
                out[o + 1] = <unsigned char>(0x80 | ((cp >> 12) & 0x3F))
                out[o + 2] = <unsigned char>(0x80 | ((cp >> 6) & 0x3F))
                out[o + 3] = <unsigned char>(0x80 | (cp & 0x3F))
                o += 4
            continue
        if c == 98:
            out[o] = 8
        elif c == 102:
            out[o] = 12
        elif c == 110:
            out[o] = 10
        elif c == 114:
            out[o] = 13
        elif c == 116:
            out[o] = 9
        else:  # \" \\ \/
            out[o] = c
        o += 1
        i += 2
    return o


cdef inline bint _is(const unsigned char* s, Py_ssize_t i, Py_ssize_t n, const char* word, Py_ssize_t wn) noexcept nogil:
    return n == wn and memcmp(s + i, word, wn) == 0


cdef Py_ssize_t _scan(const unsigned char* s, Py_ssize_t n, Py_ssize_t max_ops, Span** spans) noexcept nogil:
    """Spans of every op of a body of the accepted shape, or -1 (the caller frees *spans)."""
    cdef Py_ssize_t i, e, count = 0, cap = 64, start, nn
    cdef Span sp
    cdef Span* grown
    cdef int esc, have_op, have_key, have_value
    spans[0] = <Span*>malloc(cap * sizeof(Span))
    if spans[0] == NULL:
        return -1
    i = _ws(s, 0, n)
    if i + 5 > n or s[i] != 123:
        return -1
    i = _ws(s, i + 1, n)
    if i + 5 > n or memcmp(s + i, b'"ops"', 5) != 0:
        return -1
    i = _ws(s, i + 5, n)
    if i >= n or s[i] != 58:
        return -1
    i = _ws(s, i + 1, n)
    if i >= n or s[i] != 91:
        return -1
    i = _ws(s, i + 1, n)
    while True:  # one op object per turn
        if i >= n or s[i] != 123:
            return -1
        i = _ws(s, i + 1, n)
        have_op = have_key = have_value = 0
        sp.kind = 0
        sp.kesc = sp.vesc = 0
        while True:  # one "name": "string" field per turn
            if i >= n or s[i] != 34:
                return -1
            start = i + 1
            i = start
            while i < n and s[i] != 34 and s[i] != 92 and s[i] >= 0x20:
                i += 1
            if i >= n or s[i] != 34:
                return -1  # an escaped or unterminated name: the reference decides
            nn = i - start
            i = _ws(s, i + 1, n)
            if i >= n or s[i] != 58:
                return -1
            i = _ws(s, i + 1, n)
            if i >= n or s[i] != 34:
                return -1
            esc = 0
            e = _string_end(s, i + 1, n, &esc)
            if e < 0:
                return -1
            if _is(s, start, nn, "op", 2):
                if have_op or esc:
                    return -1
                have_op = 1
                if _is(s, i + 1, e - i - 1, "set", 3):
                    sp.kind = 1
                elif _is(s, i + 1, e - i - 1, "delete", 6):
                    sp.kind = 2
                else:
                    return -1
            elif _is(s, start, nn, "key", 3):
                if have_key:
                    return -1
                have_key = 1
                sp.ks = i + 1
                sp.kn = e - i - 1
                sp.kesc = esc
            elif _is(s, start, nn, "value", 5):
                if have_value:
                    return -1
                have_value = 1
                sp.vs = i + 1
                sp.vn = e - i - 1
                sp.vesc = esc
            else:
                return -1
            i = _ws(s, e + 1, n)
            if i < n and s[i] == 44:
                i = _ws(s, i + 1, n)
                continue
            if i < n and s[i] == 125:
                i += 1
                break
            return -1
        if not have_op or not have_key or have_value != (sp.kind == 1):
            return -1
        if count >= max_ops:
            return -1
        if count == cap:
            cap *= 2
            grown = <Span*>realloc(spans[0], cap * sizeof(Span))
            if grown == NULL:
                return -1
            spans[0] = grown
        spans[0][count] = sp
        count += 1
        i = _ws(s, i, n)
        if i < n and s[i] == 44:
            i = _ws(s, i + 1, n)
            continue
        if i < n and s[i] == 93:
            break
        return -1
    i = _ws(s, i + 1, n)
    if i >= n or s[i] != 125:
        return -1
    i = _ws(s, i + 1, n)
    return count if i == n else -1


cdef inline object _op(object kind, object key, object value, object owner):
    """``Op(kind, key, value, owner, None, 0)`` without NamedTuple.__new__ and its
    temporary tuple (what tuple.__new__ does for a subclass, minus the copy)."""
    cdef object t = PyType_GenericAlloc(<PyTypeObject*>_Op, 6)
    Py_INCREF(kind)
    PyTuple_SET_ITEM(t, 0, kind)
    Py_INCREF(key)
    PyTuple_SET_ITEM(t, 1, key)
    Py_INCREF(value)
    PyTuple_SET_ITEM(t, 2, value)
    Py_INCREF(owner)
    PyTuple_SET_ITEM(t, 3, owner)
    Py_INCREF(None)
    PyTuple_SET_ITEM(t, 4, None)
    Py_INCREF(_NO_DEADLINE)
    PyTuple_SET_ITEM(t, 5, _NO_DEADLINE)
    return t


cdef object _string(const unsigned char* s, Py_ssize_t at, Py_ssize_t n, int esc):
    cdef unsigned char* buf
    cdef Py_ssize_t m
    if not esc:
        return PyBytes_FromStringAndSize(<const char*>s + at, n)
    buf = <unsigned char*>malloc(n if n > 0 else 1)
    if buf == NULL:
        raise MemoryError()
    try:
        m = _unescape(s + at, n, buf)
        return PyBytes_FromStringAndSize(<const char*>buf, m)
    finally:
        free(buf)


def decode_json_ops(bytes body, str owner, Py_ssize_t max_ops, Py_ssize_t max_key,
                    Py_ssize_t max_value):
    """``(ops, nbytes)`` of a JSON batch body of the common shape, or ``None`` when the
    body is anything else (the reference path then accepts it or names the reason)."""
    cdef const unsigned char* s = <const unsigned char*>PyBytes_AS_STRING(body)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(body)
    cdef Span* spans = NULL
    cdef Py_ssize_t count, j, kl, vl, nbytes = 0
    cdef Span sp
    cdef list out
    cdef bytes key, value
    try:
        if n >= NOGIL_MIN:
            with nogil:
                count = _scan(s, n, max_ops, &spans)
        else:
            count = _scan(s, n, max_ops, &spans)
        if count <= 0:
            return None
        out = [None] * count
        for j in range(count):
            sp = spans[j]
            key = _string(s, sp.ks, sp.kn, sp.kesc)
            kl = PyBytes_GET_SIZE(key)
            if kl < 1 or kl > max_key:
                return None
            if sp.kind == 1:
                value = _string(s, sp.vs, sp.vn, sp.vesc)
                vl = PyBytes_GET_SIZE(value)
                if vl > max_value:
                    return None
                out[j] = _op(_SET, key, value, owner)
                nbytes += kl + vl
            else:
                out[j] = _op(_DELETE, key, b"", owner)
                nbytes += kl
        return out, nbytes
    finally:
        free(spans)
