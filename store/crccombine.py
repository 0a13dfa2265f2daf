"""CRC-32 of a concatenation from the CRCs of its parts (pure-Python twin of zlib's
``crc32_combine``, which `store/_codec.pyx` calls; `store.codec.crc32_combine` picks one).

Why: a replicated log record is covered by two CRCs that share its payload — the frame's
(over frame prefix, log header and payload) and the log record's own (over the first 58
header bytes and payload). Computing the payload's CRC once and combining it with each
prefix's checks both with one pass over the bytes.

``crc32_combine(crc32(a), crc32(b), len(b)) == crc32(a + b)``: appending ``len(b)`` zero
bits to a CRC register is a linear map over GF(2); this applies it by repeated squaring
of the one-zero-bit operator (zlib's algorithm, O(log len(b)) 32x32 matrix products).
"""

from __future__ import annotations

_POLY = 0xEDB88320
_DIM = 32


def _times(mat: list[int], vec: int) -> int:
    out = 0
    i = 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _square(mat: list[int]) -> list[int]:
    return [_times(mat, mat[n]) for n in range(_DIM)]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """CRC-32 of ``a + b`` given ``crc1 = crc32(a)``, ``crc2 = crc32(b)``, ``len2 = len(b)``."""
    if len2 < 0:
        raise ValueError("negative length")
    if len2 == 0:
        return crc1 ^ crc2  # crc2 is crc32(b"") = 0 for real input; zlib answers this too
    odd = [_POLY] + [1 << n for n in range(_DIM - 1)]  # the operator for one zero bit
    even = _square(odd)  # two zero bits
    odd = _square(even)  # four zero bits
    while True:
        even = _square(odd)  # the first pass: one zero byte
        if len2 & 1:
            crc1 = _times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = _square(even)
        if len2 & 1:
            crc1 = _times(odd, crc1)
        len2 >>= 1
        if not len2:
            break
    return crc1 ^ crc2
