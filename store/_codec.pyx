# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Cython implementation of the hot functions of `store/format.py` (which documents the
bytes and is the reference). Same names, same results; `tests/property/test_codec_agree.py`
proves the bytes identical."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy

from store.format import Entry, RecordHeader

# Checksums and hashes come from maintained C libraries, called without the GIL where a
# caller releases it: CRC-32 from libdeflate (the same CRC as Python's zlib.crc32, computed
# with carry-less multiplication where the CPU has it, several times faster than zlib's
# table-driven loop on large buffers; a replica checks every byte it receives), its
# combination from zlib; BLAKE2b from libsodium
# (crypto_generichash is unkeyed BLAKE2b with a chosen digest size, the same function as
# hashlib.blake2b(digest_size=32)).
cdef extern from "libdeflate.h":
    uint32_t libdeflate_crc32(uint32_t crc, const void* buffer, size_t len) nogil

cdef extern from "zlib.h":
    unsigned long zlib_crc32_combine "crc32_combine" (unsigned long crc1, unsigned long crc2,
                                                      long len2) nogil

cdef extern from "sodium.h":
    ctypedef struct crypto_generichash_state:
        pass
    int sodium_init() nogil
    int crypto_generichash_init(crypto_generichash_state* state, const unsigned char* key,
                                size_t keylen, size_t outlen) nogil
    int crypto_generichash_update(crypto_generichash_state* state, const unsigned char* data,
                                  unsigned long long datalen) nogil
    int crypto_generichash_final(crypto_generichash_state* state, unsigned char* out,
                                 size_t outlen) nogil

# SHA-256 from OpenSSL's libcrypto, the library Python's hashlib uses: it runs on the CPU's
# SHA extensions where they exist (about 1.7x BLAKE2b's speed here). The digest is fetched
# once; each chaining call makes one context and reuses it for every link.
cdef extern from "openssl/evp.h":
    ctypedef struct EVP_MD:
        pass
    ctypedef struct EVP_MD_CTX:
        pass
    ctypedef struct OSSL_LIB_CTX:
        pass
    EVP_MD* EVP_MD_fetch(OSSL_LIB_CTX* ctx, const char* algorithm, const char* properties)
    EVP_MD_CTX* EVP_MD_CTX_new() nogil
    void EVP_MD_CTX_free(EVP_MD_CTX* ctx) nogil
    int EVP_DigestInit_ex2(EVP_MD_CTX* ctx, const EVP_MD* type, const void* params) nogil
    int EVP_DigestUpdate(EVP_MD_CTX* ctx, const void* d, size_t cnt) nogil
    int EVP_DigestFinal_ex(EVP_MD_CTX* ctx, unsigned char* md, unsigned int* s) nogil

# Picks libsodium's fastest BLAKE2b for this CPU; < 0 only when it cannot start at all.
if sodium_init() < 0:
    raise ImportError("libsodium failed to initialise")

cdef const EVP_MD* _SHA256 = EVP_MD_fetch(NULL, b"SHA256", NULL)
if _SHA256 == NULL:
    raise ImportError("OpenSSL offers no SHA-256")

cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject* t, Py_ssize_t n)

cdef object _entry = Entry
cdef object _header = RecordHeader
cdef object _tuple_new = tuple.__new__

# The byte constants of `store/format.py` (the reference). Cython needs them at compile
# time; `CONSTANTS` below exposes them so tests/property/test_codec_agree.py compares every
# one with format.py.
DEF HASH_SIZE = 32
DEF ENTRY_HDR = 16
DEF RECORD_FIXED = 19
DEF RECORD_TAG = 0x01
DEF LOG_TAG = 0x01
DEF FLAG_CHUNKED = 0x01
DEF FLAG_EXPIRES = 0x02
DEF OP_SET = 1
DEF OP_DELETE = 2
DEF OP_DOC = 3
DEF OP_SET_EXPIRING = 4
DEF OP_EXPIRE = 5
DEF DEADLINE_SIZE = 8
DEF MAX_KEY = 500
DEF MAX_OWNER = 255
DEF MAX_ENTRY_KEY = 65535
DEF MAX_VALUE = 25 << 20
DEF CHUNK_SIZE = 4080
DEF CHAIN_BLAKE2B = 1
DEF CHAIN_SHA256 = 2

CONSTANTS = {
    "HASH_SIZE": HASH_SIZE,
    "ENTRY_FIXED": ENTRY_HDR,
    "RECORD_FIXED": RECORD_FIXED,
    "RECORD_TAG": RECORD_TAG,
    "LOG_TAG": LOG_TAG,
    "FLAG_CHUNKED": FLAG_CHUNKED,
    "FLAG_EXPIRES": FLAG_EXPIRES,
    "OP_SET": OP_SET,
    "OP_DELETE": OP_DELETE,
    "OP_DOC": OP_DOC,
    "OP_SET_EXPIRING": OP_SET_EXPIRING,
    "OP_EXPIRE": OP_EXPIRE,
    "MAX_KEY": MAX_KEY,
    "MAX_OWNER": MAX_OWNER,
    "MAX_ENTRY_KEY": MAX_ENTRY_KEY,
    "MAX_VALUE": MAX_VALUE,
    "CHUNK_SIZE": CHUNK_SIZE,
    "CHAIN_BLAKE2B": CHAIN_BLAKE2B,
    "CHAIN_SHA256": CHAIN_SHA256,
}


cdef inline long long _stored_bytes(Py_ssize_t key_len, Py_ssize_t value_len,
                                    Py_ssize_t owner_len) noexcept nogil:
    # The usage formula of `store/usage.py:stored_bytes` (tested equal there).
    return key_len + value_len + RECORD_FIXED + owner_len


def stored_bytes(Py_ssize_t key_len, Py_ssize_t value_len, Py_ssize_t owner_len):
    """What one key costs its owner (same as `store.usage.stored_bytes`)."""
    return _stored_bytes(key_len, value_len, owner_len)

cdef inline uint32_t _crc_update(uint32_t crc, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    # CRC-32 (zlib polynomial); `crc` is the running value as zlib returns it.
    return libdeflate_crc32(crc, p, <size_t>n)


cdef inline void _blake2b_2(const uint8_t* a, size_t an, const uint8_t* b, size_t bn,
                            uint8_t* out) noexcept nogil:
    # BLAKE2b-256(a ++ b); `out` may alias `a` (the state has consumed `a` before `final`).
    cdef crypto_generichash_state st
    crypto_generichash_init(&st, NULL, 0, HASH_SIZE)
    crypto_generichash_update(&st, a, an)
    crypto_generichash_update(&st, b, bn)
    crypto_generichash_final(&st, out, HASH_SIZE)


cdef struct _Chain:
    # One chaining pass: the chain hash and, for SHA-256, the OpenSSL context every link
    # of the pass reuses (`_chain_open` / `_chain_close`).
    int alg
    EVP_MD_CTX* ctx


cdef int _chain_open(_Chain* c, int alg) except -1:
    c.alg = alg
    c.ctx = NULL
    if alg == CHAIN_SHA256:
        c.ctx = EVP_MD_CTX_new()
        if c.ctx == NULL:
            raise MemoryError()
    elif alg != CHAIN_BLAKE2B:
        raise ValueError(f"unknown chain hash {alg}")
    return 0


cdef int _chain_start(_Chain* c, int alg, bytes prev_hash, uint8_t* h) except -1:
    # A chaining pass from `prev_hash`: checked and copied into `h`, `c` opened for `alg`
    # (close it with `_chain_close`).
    if PyBytes_GET_SIZE(prev_hash) != HASH_SIZE:
        raise ValueError("prev_hash must be 32 bytes")
    memcpy(h, PyBytes_AS_STRING(prev_hash), HASH_SIZE)
    return _chain_open(c, alg)


cdef inline void _chain_close(_Chain* c) noexcept nogil:
    if c.ctx != NULL:
        EVP_MD_CTX_free(c.ctx)
        c.ctx = NULL


cdef inline int _link(_Chain* c, const uint8_t* a, size_t an, const uint8_t* b, size_t bn,
                      uint8_t* out) noexcept nogil:
    # H(a ++ b) into `out` (which may alias `a`); 0, or -1 when OpenSSL failed.
    if c.alg == CHAIN_BLAKE2B:
        _blake2b_2(a, an, b, bn, out)
        return 0
    if (EVP_DigestInit_ex2(c.ctx, _SHA256, NULL) != 1
            or EVP_DigestUpdate(c.ctx, a, an) != 1
            or EVP_DigestUpdate(c.ctx, b, bn) != 1
            or EVP_DigestFinal_ex(c.ctx, out, NULL) != 1):
        return -1
    return 0


def crc32_combine(uint32_t crc1, uint32_t crc2, Py_ssize_t len2):
    """CRC-32 of a + b from crc32(a), crc32(b) and len(b) (zlib's; the pure twin is
    `store/crccombine.py`)."""
    if len2 < 0:
        raise ValueError("negative length")
    return <uint32_t>zlib_crc32_combine(crc1, crc2, len2)


def crc32(const uint8_t[:] data, uint32_t crc=0):
    """CRC-32 of `data`, continuing from `crc` (same results as zlib.crc32)."""
    if data.shape[0] == 0:
        return crc
    return _crc_update(crc, &data[0], data.shape[0])


cdef inline void _put_u64(uint8_t* p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = (v >> (8 * i)) & 0xFF


cdef inline void _put_u32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = (v >> 24) & 0xFF


cdef inline uint64_t _get_u64(const uint8_t* p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(7, -1, -1):
        v = (v << 8) | p[i]
    return v


cdef inline uint32_t _get_u32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


def encode_record(bytes key, uint64_t seq, bytes owner, bytes value, bint chunked,
                  bint expires=False):
    """Encode the value record of `key` (its CRC covers the key); when `chunked`, the
    value is left out; `expires` sets FLAG_EXPIRES."""
    return _encode_record(key, seq, owner, value, chunked, expires)


cdef bytes _encode_record(bytes key, uint64_t seq, bytes owner, bytes value, bint chunked,
                          bint expires):
    cdef Py_ssize_t on = PyBytes_GET_SIZE(owner)
    if on > MAX_OWNER:
        raise ValueError("owner too long")
    return _encode_record_raw(
        key, seq, <const uint8_t*>PyBytes_AS_STRING(owner), on,
        <const uint8_t*>PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), chunked, expires)


def decode_record_header(const uint8_t[:] rec):
    """Decode the fixed part of a record; raises ValueError on a malformed record."""
    cdef Py_ssize_t n = rec.shape[0]
    if n < RECORD_FIXED or rec[0] != RECORD_TAG:
        raise ValueError("malformed value record")
    cdef const uint8_t* p = &rec[0]
    cdef uint32_t vlen = _get_u32(p + 10)
    cdef Py_ssize_t on = p[18]
    cdef Py_ssize_t off = RECORD_FIXED + on
    if n < off or (not (p[1] & FLAG_CHUNKED) and n != off + vlen):
        raise ValueError("malformed value record")
    owner = (<const char*>p)[19:off].decode("utf-8", "replace")
    return _tuple_new(_header, (p[1], _get_u64(p + 2), vlen, _get_u32(p + 14), owner, off))


def record_value(const uint8_t[:] key, const uint8_t[:] rec):
    """The inline value of `rec` (stored under `key`) after checking its CRC; None when
    the CRC fails."""
    cdef Py_ssize_t n = rec.shape[0]
    if n < RECORD_FIXED or rec[0] != RECORD_TAG:
        raise ValueError("malformed value record")
    cdef const uint8_t* p = &rec[0]
    if p[1] & FLAG_CHUNKED:
        raise ValueError("record is chunked")
    cdef uint32_t vlen = _get_u32(p + 10)
    cdef Py_ssize_t off = RECORD_FIXED + p[18]
    if n != off + vlen:
        raise ValueError("malformed value record")
    cdef uint32_t crc = 0
    if key.shape[0]:
        crc = _crc_update(0, &key[0], key.shape[0])
    crc = _crc_update(crc, p, 14)
    crc = _crc_update(crc, p + 18, n - 18)
    if crc != _get_u32(p + 14):
        return None
    return PyBytes_FromStringAndSize(<const char*>(p + off), vlen)


def encode_entry(uint64_t seq, int op, bytes owner, bytes key, bytes value):
    """Encode one log entry."""
    cdef Py_ssize_t on = PyBytes_GET_SIZE(owner)
    cdef Py_ssize_t kn = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t vn = PyBytes_GET_SIZE(value)
    if on > MAX_OWNER or kn > MAX_ENTRY_KEY:
        raise ValueError("owner or key too long")
    cdef bytes out = PyBytes_FromStringAndSize(NULL, ENTRY_HDR + on + kn + vn)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    _write_entry(p, seq, op, owner, key, value)
    return out


cdef inline Py_ssize_t _write_entry(uint8_t* p, uint64_t seq, int op, bytes owner, bytes key,
                                    bytes value):
    cdef Py_ssize_t on = PyBytes_GET_SIZE(owner)
    cdef Py_ssize_t kn = PyBytes_GET_SIZE(key)
    cdef Py_ssize_t vn = PyBytes_GET_SIZE(value)
    _put_u64(p, seq)
    p[8] = <uint8_t>op
    p[9] = <uint8_t>on
    p[10] = kn & 0xFF
    p[11] = (kn >> 8) & 0xFF
    _put_u32(p + 12, <uint32_t>vn)
    memcpy(p + 16, PyBytes_AS_STRING(owner), on)
    memcpy(p + 16 + on, PyBytes_AS_STRING(key), kn)
    memcpy(p + 16 + on + kn, PyBytes_AS_STRING(value), vn)
    return ENTRY_HDR + on + kn + vn


cdef inline Py_ssize_t _entry_size(const uint8_t* p) noexcept nogil:
    """Bytes of the entry whose header starts at `p` (header + owner + key + value)."""
    return ENTRY_HDR + p[9] + (p[10] | (p[11] << 8)) + _get_u32(p + 12)


def chain(bytes prev, entry, int alg=CHAIN_BLAKE2B):
    """One link of the hash chain: H(prev ++ entry), H the chain hash `alg`."""
    cdef const uint8_t[:] e = entry
    cdef bytes out = PyBytes_FromStringAndSize(NULL, HASH_SIZE)
    cdef const uint8_t* ep = &e[0] if e.shape[0] else <const uint8_t*>b""
    cdef _Chain c
    cdef int rc
    _chain_open(&c, alg)
    rc = _link(&c, <const uint8_t*>PyBytes_AS_STRING(prev), PyBytes_GET_SIZE(prev), ep,
               e.shape[0], <uint8_t*>PyBytes_AS_STRING(out))
    _chain_close(&c)
    if rc:
        raise RuntimeError("OpenSSL failed to hash a chain link")
    return out


def pack_entries(uint64_t first_seq, list ops, bytes prev_hash, int alg=CHAIN_BLAKE2B):
    """Encode ops ``(op, owner, key, value)`` as consecutive entries from `first_seq`.

    Returns the uncompressed payload and the hash head (chain hash `alg`) after the last
    entry.
    """
    cdef Py_ssize_t total = 0
    cdef tuple t
    cdef bytes owner, key, value
    for t in ops:
        owner = t[1]
        key = t[2]
        value = t[3]
        if PyBytes_GET_SIZE(owner) > MAX_OWNER or PyBytes_GET_SIZE(key) > MAX_ENTRY_KEY:
            raise ValueError("owner or key too long")
        total += ENTRY_HDR + PyBytes_GET_SIZE(owner) + PyBytes_GET_SIZE(key) + PyBytes_GET_SIZE(value)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* base = <uint8_t*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t pos = 0
    cdef uint64_t seq = first_seq
    cdef uint8_t h[HASH_SIZE]
    cdef _Chain c
    cdef int rc
    _chain_start(&c, alg, prev_hash, h)
    try:
        for t in ops:
            pos += _write_entry(base + pos, seq, t[0], t[1], t[2], t[3])
            seq += 1
        # The chain is pure C over the finished buffer: on big batches hash it without the
        # GIL, so a gateway's event loop runs meanwhile.
        if total >= 65536:
            with nogil:
                rc = _chain_buffer(&c, base, total, h)
        else:  # dropping the GIL costs more than it frees on small batches
            rc = _chain_buffer(&c, base, total, h)
    finally:
        _chain_close(&c)
    if rc:
        raise RuntimeError("OpenSSL failed to hash a chain link")
    return out, PyBytes_FromStringAndSize(<const char*>h, HASH_SIZE)


cdef int _chain_buffer(_Chain* c, const uint8_t* base, Py_ssize_t total,
                       uint8_t* h) noexcept nogil:
    """Fold every entry of a well-formed entry buffer into the chain head `h` (0, or -1
    when a link failed)."""
    cdef Py_ssize_t pos = 0, n
    while pos < total:
        n = _entry_size(base + pos)
        if _link(c, h, HASH_SIZE, base + pos, n, h):
            return -1
        pos += n
    return 0


def unpack_entries(payload, bytes prev_hash, int alg=CHAIN_BLAKE2B):
    """Decode a batch payload and recompute the chain (hash `alg`) from `prev_hash`.

    Returns the entries and the hash head. Raises ValueError on malformed bytes.
    """
    cdef uint8_t h[HASH_SIZE]
    cdef _Chain c
    _chain_start(&c, alg, prev_hash, h)
    try:
        out = _entries(payload, &c, h)
    finally:
        _chain_close(&c)
    return out, PyBytes_FromStringAndSize(<const char*>h, HASH_SIZE)


def decode_entries(payload):
    """Decode a batch payload without the chain (see store/format.py); ValueError on
    malformed bytes, as `unpack_entries`."""
    return _entries(payload, NULL, NULL)


cdef list _entries(payload, _Chain* c, uint8_t* h):
    # The entries of `payload`, each folded into `h` with `c` (NULL: decode only).
    cdef const uint8_t[:] buf = payload
    cdef Py_ssize_t n = buf.shape[0]
    cdef Py_ssize_t pos = 0, a, end
    cdef uint64_t seq
    cdef int op
    cdef Py_ssize_t on, kn
    cdef list out = []
    cdef const uint8_t* p
    if n == 0:
        return out
    p = &buf[0]
    while pos < n:
        if pos + ENTRY_HDR > n:
            raise ValueError("truncated log entry header")
        seq = _get_u64(p + pos)
        op = p[pos + 8]
        on = p[pos + 9]
        kn = p[pos + 10] | (p[pos + 11] << 8)
        end = pos + _entry_size(p + pos)
        if end > n or op < OP_SET or op > OP_EXPIRE:
            raise ValueError("malformed log entry")
        a = pos + ENTRY_HDR
        owner = (<const char*>p)[a:a + on].decode("utf-8", "replace")
        key = PyBytes_FromStringAndSize(<const char*>(p + a + on), kn)
        value = PyBytes_FromStringAndSize(<const char*>(p + a + on + kn), end - a - on - kn)
        if c != NULL and _link(c, h, HASH_SIZE, p + pos, end - pos, h):
            raise RuntimeError("OpenSSL failed to hash a chain link")
        out.append(_tuple_new(_entry, (seq, op, owner, key, value)))
        pos = end
    return out


# --- the per-op loop of Store.apply (reference: store/applyloop.py) ------------------------

from core.errors import InvalidOpError
from store.applyloop import APPEND_RUN
from store.ops import Result, Status
from store.format import DEADLINE

cdef Py_ssize_t _APPEND_RUN = APPEND_RUN

cdef object _Result = Result
cdef object _PF = Status.PRECONDITION_FAILED
cdef object _DUP = Status.DUPLICATE
cdef object _WRITTEN = Status.WRITTEN
cdef object _ABSENT = Status.ABSENT
cdef object _DELETED = Status.DELETED
cdef object _EXPIRED = Status.EXPIRED
cdef object _DEADLINE = DEADLINE
cdef object _U64_END = 1 << 64


cdef inline object _result(object status, object seq):
    """``Result(status, seq)`` without tuple.__new__'s call and temporary tuple (as
    gateway/_jsonops.pyx builds its Ops): one allocation for each op of every batch."""
    cdef object t = PyType_GenericAlloc(<PyTypeObject*>_Result, 2)
    Py_INCREF(status)
    PyTuple_SET_ITEM(t, 0, status)
    Py_INCREF(seq)
    PyTuple_SET_ITEM(t, 1, seq)
    return t


cdef inline list _delta_for(dict delta, str owner):
    cdef object d = delta.get(owner)
    if d is None:
        d = [0, 0, 0, 0, 0, 0]
        delta[owner] = d
    return <list>d


cdef inline void _count_expiry(list d) except *:
    # The seventh usage counter, added only when there is an expiry (applyloop.count_expiry).
    if len(d) < 7:
        d.append(0)
    d[6] += 1


cdef void _forget(const uint8_t* p, Py_ssize_t key_len, dict delta, object rare,
                  object key) except *:
    cdef uint64_t oseq = _get_u64(p + 2)
    cdef uint32_t vlen = _get_u32(p + 10)
    cdef Py_ssize_t on = p[18]
    if p[1] & FLAG_CHUNKED:
        rare.drop_chunks(oseq, vlen)
    if p[1] & FLAG_EXPIRES:
        rare.clear_deadline(key)
    owner = (<const char*>p)[19:19 + on].decode("utf-8", "replace")
    cdef list d = _delta_for(delta, owner)
    d[0] -= 1
    d[1] -= _stored_bytes(key_len, vlen, on)


def apply_ops(ops, get, put, delete, uint64_t last_seq, rare, max_key=None, append=None):
    """Process `ops` in order inside the caller's write transaction (see applyloop.py).

    `get`/`put`/`delete` act on the data sub-database (the transaction's default)."""
    cdef list results = []
    cdef list entries = []
    cdef dict delta = {}
    cdef dict owners = {}
    cdef uint64_t seq = last_seq
    cdef object old, expect, value, key, ob, dlo
    cdef bytes owner
    cdef str owner_s
    cdef const uint8_t* p
    cdef Py_ssize_t n = 0, kn, vn, on, off
    cdef uint64_t cur, dl
    cdef uint32_t ovlen
    cdef int opk
    cdef bint big, dup, fresh
    cdef list d = None
    cdef object cur_owner = None
    # Per-owner counters of the current run of ops by one owner, kept in C and added to
    # `delta` when the owner changes and at the end (most batches have a single owner).
    cdef long long c_keys = 0, c_bytes = 0, c_writes = 0
    cdef tuple op
    cdef list run = []  # fresh records not appended yet (see applyloop.apply_ops)
    for op_obj in ops:
        if not isinstance(op_obj, tuple) or len(op_obj) != 6:
            raise TypeError("ops must be store.ops.Op tuples")
        op = <tuple>op_obj
        opk = op[0]
        key = op[1]
        value = op[2]
        owner_s = op[3]
        expect = op[4]
        dlo = op[5]
        if dlo < 0 or dlo >= _U64_END:
            raise InvalidOpError(f"deadline {dlo} out of range")
        dl = dlo
        if type(key) is not bytes or type(value) is not bytes:
            key = bytes(key)
            value = bytes(value)
        kn = PyBytes_GET_SIZE(key)
        vn = PyBytes_GET_SIZE(value)
        if kn < 1 or kn > MAX_KEY:
            raise InvalidOpError(f"key must be 1 to {MAX_KEY} bytes, got {kn}")
        if opk != OP_SET and opk != OP_DELETE and opk != OP_EXPIRE:
            raise InvalidOpError(f"unknown op {opk}")
        if vn > MAX_VALUE:
            raise InvalidOpError(f"value of {vn} bytes exceeds {MAX_VALUE}")
        ob = owners.get(owner_s)
        if ob is None:
            ob = owner_s.encode()
            if PyBytes_GET_SIZE(ob) > MAX_OWNER:
                raise InvalidOpError(f"owner name longer than {MAX_OWNER} bytes")
            owners[owner_s] = ob
        owner = <bytes>ob
        fresh = append is not None and (max_key is None or key > max_key)
        if not fresh and run:
            append(run)
            run = []
        old = None if fresh else get(key)
        cur = 0
        p = NULL
        if old is not None:
            n = PyBytes_GET_SIZE(old)
            p = <const uint8_t*>PyBytes_AS_STRING(old)
            if n < RECORD_FIXED or p[0] != RECORD_TAG:
                raise ValueError("malformed value record")
            cur = _get_u64(p + 2)
        if expect is not None and <uint64_t>expect != cur:
            results.append(_result(_PF, cur))
            continue
        if owner_s is not cur_owner:
            if d is not None:
                d[0] += c_keys
                d[1] += c_bytes
                d[2] += c_writes
                c_keys = c_bytes = c_writes = 0
            d = _delta_for(delta, owner_s)
            cur_owner = owner_s
        if opk == OP_SET:
            if p != NULL:
                ovlen = _get_u32(p + 10)
                if ovlen == vn:
                    if p[1] & FLAG_CHUNKED:
                        dup = rare.chunked_equal(cur, ovlen, value)
                    else:
                        off = RECORD_FIXED + p[18]
                        dup = n == off + vn and memcmp(p + off, PyBytes_AS_STRING(value), vn) == 0
                    # Same bytes but another deadline (or none where there was one) is a write.
                    if dup and (p[1] & FLAG_EXPIRES or dl):
                        dup = (p[1] & FLAG_EXPIRES) != 0 and rare.deadline(key) == dl
                    if dup:
                        d[4] += 1
                        results.append(_result(_DUP, cur))
                        continue
            seq += 1
            big = vn > CHUNK_SIZE
            if big:
                rare.put_chunks(seq, value)
            if fresh:
                run.append((key, _encode_record(key, seq, owner, value, big, dl != 0)))
                if PyList_GET_SIZE(run) >= _APPEND_RUN:
                    append(run)
                    run = []
                max_key = key
            else:
                put(key, _encode_record(key, seq, owner, value, big, dl != 0))
            if p != NULL:
                _forget(p, kn, delta, rare, key)
            if dl:
                rare.set_deadline(key, dl)
            c_keys += 1
            c_bytes += _stored_bytes(kn, vn, PyBytes_GET_SIZE(owner))
            c_writes += 1
            if dl:
                entries.append((OP_SET_EXPIRING, owner, key, _DEADLINE.pack(dl) + value))
            else:
                entries.append((OP_SET, owner, key, value))
            results.append(_result(_WRITTEN, seq))
        else:
            if p == NULL or (opk == OP_EXPIRE and not (p[1] & FLAG_EXPIRES)):
                results.append(_result(_ABSENT, cur))
                continue
            seq += 1
            delete(key)
            _forget(p, kn, delta, rare, key)
            if opk == OP_EXPIRE:  # not a producer's delete: its owner's usage counts an expiry
                _count_expiry(d)
                entries.append((OP_EXPIRE, owner, key, b""))
                results.append(_result(_EXPIRED, seq))
            else:
                d[3] += 1
                entries.append((OP_DELETE, owner, key, b""))
                results.append(_result(_DELETED, seq))
    if run:
        append(run)
    if d is not None:
        d[0] += c_keys
        d[1] += c_bytes
        d[2] += c_writes
    return results, entries, seq, delta


# --- a replica's per-entry work on a log record (reference: store/replay.py) ---------------

cdef int _scan_buffer(_Chain* c, const uint8_t* p, Py_ssize_t n, uint64_t first_seq,
                      uint8_t* h, Py_ssize_t* count, Py_ssize_t* bad_pos) noexcept nogil:
    """Check and chain every entry of `p[:n]` into `h`; 0 when all hold, else the code of
    the first problem (its entry's offset in `bad_pos`, entries before it in `count`)."""
    cdef Py_ssize_t pos = 0, end
    cdef uint64_t seq
    cdef int op
    cdef Py_ssize_t kn
    cdef uint32_t vn
    count[0] = 0
    while pos < n:
        bad_pos[0] = pos
        if pos + ENTRY_HDR > n:
            return 1
        seq = _get_u64(p + pos)
        if seq != first_seq + <uint64_t>count[0]:
            return 2
        op = p[pos + 8]
        if op < OP_SET or op > OP_EXPIRE:
            return 3
        kn = p[pos + 10] | (p[pos + 11] << 8)
        if kn < 1 or kn > MAX_KEY:
            return 4
        vn = _get_u32(p + pos + 12)
        if op == OP_SET_EXPIRING:  # the deadline, then the value
            if vn < DEADLINE_SIZE or vn - DEADLINE_SIZE > MAX_VALUE:
                return 5
        elif vn > MAX_VALUE or ((op == OP_DELETE or op == OP_EXPIRE) and vn):
            return 5
        end = pos + _entry_size(p + pos)
        if end > n:
            return 6
        if _link(c, h, HASH_SIZE, p + pos, end - pos, h):
            return 7
        pos = end
        count[0] += 1
    return 0


def scan_entries(payload, bytes prev_hash, uint64_t first_seq, Py_ssize_t num_entries,
                 int alg=CHAIN_BLAKE2B):
    """Check every entry of a record's payload and return the hash head (chain hash `alg`)
    after the last (see store/replay.py; ValueError names the first entry no store
    accepts)."""
    cdef const uint8_t[:] buf = payload
    cdef Py_ssize_t n = buf.shape[0], count = 0, bad = 0
    cdef const uint8_t* p = &buf[0] if n else <const uint8_t*>b""
    cdef uint8_t h[HASH_SIZE]
    cdef int code
    cdef _Chain c
    _chain_start(&c, alg, prev_hash, h)
    if n >= 65536:  # hashing a large record: let the event loop's thread run meanwhile
        with nogil:
            code = _scan_buffer(&c, p, n, first_seq, h, &count, &bad)
            _chain_close(&c)
    else:
        code = _scan_buffer(&c, p, n, first_seq, h, &count, &bad)
        _chain_close(&c)
    if code == 7:
        raise RuntimeError("OpenSSL failed to hash a chain link")
    if code == 0:
        if count != num_entries:
            raise ValueError(f"{count} entries, the header says {num_entries}")
        return PyBytes_FromStringAndSize(<const char*>h, HASH_SIZE)
    if code == 1:
        raise ValueError("truncated entry header")
    cdef uint64_t seq = _get_u64(p + bad)
    if code == 2:
        raise ValueError(f"entry {count} has seq {seq}, expected {first_seq + count}")
    if code == 3:
        raise ValueError(f"entry at seq {seq} has unknown op code {p[bad + 8]}")
    if code == 4:
        raise ValueError(
            f"entry at seq {seq} has a key of {p[bad + 10] | (p[bad + 11] << 8)} bytes "
            f"(1..{MAX_KEY})")
    if code == 5:
        raise ValueError(f"entry at seq {seq} has a value of {_get_u32(p + bad + 12)} bytes")
    raise ValueError(f"entry at seq {seq} runs past the payload")


cdef bytes _encode_record_raw(bytes key, uint64_t seq, const uint8_t* owner, Py_ssize_t on,
                              const uint8_t* v, Py_ssize_t vn, bint chunked, bint expires):
    # The value record of `key` from raw pointers (`_encode_record`'s bytes, or a value
    # that stays inside a log record's payload); its CRC covers the key. The caller checks
    # `on` <= MAX_OWNER.
    cdef Py_ssize_t total = RECORD_FIXED + on + (0 if chunked else vn)
    cdef bytes out = PyBytes_FromStringAndSize(NULL, total)
    cdef uint8_t* p = <uint8_t*>PyBytes_AS_STRING(out)
    p[0] = RECORD_TAG
    p[1] = (FLAG_CHUNKED if chunked else 0) | (FLAG_EXPIRES if expires else 0)
    _put_u64(p + 2, seq)
    _put_u32(p + 10, <uint32_t>vn)
    p[18] = <uint8_t>on
    memcpy(p + 19, owner, on)
    if not chunked:
        memcpy(p + 19 + on, v, vn)
    cdef uint32_t crc = _crc_update(
        0, <const uint8_t*>PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
    crc = _crc_update(crc, p, 14)
    crc = _crc_update(crc, p + 18, 1 + on)
    crc = _crc_update(crc, v, vn)
    _put_u32(p + 14, crc)
    return out


cdef void _check_old(object old) except *:
    # What `decode_record_header` refuses (the replica's old record is read through it).
    cdef Py_ssize_t n = PyBytes_GET_SIZE(old)
    cdef const uint8_t* p = <const uint8_t*>PyBytes_AS_STRING(old)
    if n < RECORD_FIXED or p[0] != RECORD_TAG:
        raise ValueError("malformed value record")
    cdef Py_ssize_t off = RECORD_FIXED + p[18]
    if n < off or (not (p[1] & FLAG_CHUNKED) and n != off + _get_u32(p + 10)):
        raise ValueError("malformed value record")


def apply_entries(payload, get, put, delete, rare, doc, dict delta, max_key=None,
                  append=None):
    """Apply the entries of `payload`, which `scan_entries` accepted; returns the largest
    key after them (see store/replay.py)."""
    cdef const uint8_t[:] buf = payload
    cdef Py_ssize_t n = buf.shape[0], pos = 0, a, k, v, on, kn, vn
    cdef const uint8_t* base
    cdef const uint8_t* p
    cdef uint64_t seq, dl
    cdef int op
    cdef object mv = None, old, key
    cdef bint big, fresh, is_set
    # The owner of the previous change: most records have one (no decode, no lookup).
    cdef const uint8_t* prev_owner = NULL
    cdef Py_ssize_t prev_on = -1
    cdef str name
    cdef list d = None
    if n == 0:
        return max_key
    base = &buf[0]
    while pos < n:
        p = base + pos
        # `scan_entries` accepted these bytes; still never read past them.
        if pos + ENTRY_HDR > n or pos + _entry_size(p) > n:
            raise ValueError("entry runs past the payload")
        seq = _get_u64(p)
        op = p[8]
        on = p[9]
        kn = p[10] | (p[11] << 8)
        vn = _get_u32(p + 12)
        a = pos + ENTRY_HDR
        k = a + on
        v = k + kn
        pos = v + vn
        key = PyBytes_FromStringAndSize(<const char*>(base + k), kn)
        if op == OP_DOC:  # a replicated document, never a user key
            doc(seq, key, PyBytes_FromStringAndSize(<const char*>(base + v), vn))
            continue
        is_set = op == OP_SET or op == OP_SET_EXPIRING
        fresh = append is not None and is_set and (max_key is None or key > max_key)
        old = None if fresh else get(key)
        if old is not None:
            if type(old) is not bytes:
                old = bytes(old)
            _check_old(old)
            _forget(<const uint8_t*>PyBytes_AS_STRING(old), kn, delta, rare, key)
        if d is None or on != prev_on or memcmp(prev_owner, base + a, on) != 0:
            name = (<const char*>base)[a:k].decode("utf-8", "replace")
            d = _delta_for(delta, name)
            prev_owner, prev_on = base + a, on
        if is_set:
            dl = 0
            if op == OP_SET_EXPIRING:
                dl = _get_u64(base + v)
                v += DEADLINE_SIZE
                vn -= DEADLINE_SIZE
            big = vn > CHUNK_SIZE
            if big:
                if mv is None:
                    mv = memoryview(payload)
                rare.put_chunks(seq, mv[v:pos])  # LMDB copies it: no value bytes object
            if fresh:
                append(key, _encode_record_raw(key, seq, base + a, on, base + v, vn, big,
                                               dl != 0),
                       True, True, True)
                max_key = key
            else:
                put(key, _encode_record_raw(key, seq, base + a, on, base + v, vn, big, dl != 0))
            if dl:
                rare.set_deadline(key, dl)
            d[0] += 1
            d[1] += _stored_bytes(kn, vn, on)
            d[2] += 1
        else:
            delete(key)
            if op == OP_DELETE:
                d[3] += 1
            else:  # an expiry: not a producer's delete
                _count_expiry(d)
    return max_key
