"""The codec in use: the Cython build of `store/_codec.pyx`, or the pure-Python reference
`store/format.py` (with `applyloop`, `replay` and `crccombine`) when ``MERCURY_PURE=1`` or
the extension is not built (`core/compiled.py` decides, as for every compiled module).

Everything outside the store imports codec functions from here, never from either
implementation directly, so one switch moves the whole process.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

from core import compiled
from store import applyloop as _loop
from store import crccombine as _crccombine
from store import format as _ref
from store import replay as _replay

IMPLEMENTATION: str

# (key, seq, owner, value, chunked, expires=False)
encode_record: Callable[..., bytes]
decode_record_header: Callable[[Any], _ref.RecordHeader]
record_value: Callable[[Any, Any], bytes | None]
encode_entry: Callable[[int, int, bytes, bytes, bytes], bytes]
# The chain hash's code (`format.CHAIN_*`) is the optional last argument of `chain`,
# `pack_entries`, `unpack_entries` and `scan_entries` (BLAKE2b when left out).
chain: Callable[..., bytes]
pack_entries: Callable[..., tuple[bytes, bytes]]
unpack_entries: Callable[..., tuple[list[_ref.Entry], bytes]]
decode_entries: Callable[[Any], list[_ref.Entry]]
crc32: Callable[..., int]
crc32_combine: Callable[[int, int, int], int]
apply_ops: Callable[..., Any]
scan_entries: Callable[..., bytes]
apply_entries: Callable[..., bytes | None]

_impl: Any  # the module whose functions are bound above (`store._codec` or `store.format`)
IMPLEMENTATION = "python" if compiled.load("store._codec") is None else "cython"


def use(implementation: str) -> None:
    """Switch this process to ``"cython"`` or ``"python"`` (benchmarks compare both in one
    run). Callers look functions up on this module at call time, so the switch is global."""
    global IMPLEMENTATION, _impl, crc32, crc32_combine
    global encode_record, decode_record_header, record_value, encode_entry, chain
    global pack_entries, unpack_entries, decode_entries, apply_ops, scan_entries, apply_entries
    if implementation == "cython":
        _codec = compiled.require("store._codec")
        _impl, crc32, crc32_combine = _codec, _codec.crc32, _codec.crc32_combine
    elif implementation == "python":
        _impl, crc32, crc32_combine = _ref, zlib.crc32, _crccombine.crc32_combine
    else:
        raise ValueError(f"unknown codec implementation {implementation!r}")
    IMPLEMENTATION = implementation
    encode_record = _impl.encode_record
    decode_record_header = _impl.decode_record_header
    record_value = _impl.record_value
    encode_entry = _impl.encode_entry
    chain = _impl.chain
    pack_entries = _impl.pack_entries
    unpack_entries = _impl.unpack_entries
    decode_entries = _impl.decode_entries
    apply_ops = _impl.apply_ops if implementation == "cython" else _loop.apply_ops
    scan_entries = _impl.scan_entries if implementation == "cython" else _replay.scan_entries
    apply_entries = _impl.apply_entries if implementation == "cython" else _replay.apply_entries


use(IMPLEMENTATION)
