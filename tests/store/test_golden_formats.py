"""Golden files pin the on-disk bytes: a drift without a format version bump fails here.

To regenerate after a deliberate format change (and a CURRENT_FORMAT bump with a
migration): ``MERCURY_UPDATE_GOLDEN=1 .venv/bin/pytest tests/store/test_golden_formats.py``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from store import codec, nodedocs
from store import format as ref
from store.store import CURRENT_FORMAT

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDEN_FORMAT = 7  # the format these files describe


def _cases() -> dict[str, bytes]:
    ops = [
        (ref.OP_SET, b"team-a", b"cfg/edge/ttl", b"300"),
        (ref.OP_DELETE, b"team-a", b"cfg/edge/old", b""),
        (ref.OP_SET, b"", b"\x00bin\xff", bytes(range(16))),
    ]
    payload, head = codec.pack_entries(41, ops, ref.ZERO_HASH)
    header = ref.encode_log_header(0, 41, 3, 1_700_000_000_000_000, head, payload)
    doc_payload, _ = codec.pack_entries(44, [(ref.OP_DOC, b"", b"acl", b'{"producers":{}}')], head)
    # format 5: an idempotency answer, an op-3 entry under NUL ++ its idempotency key
    answer = nodedocs.answer_entry(b"iteam-a\x00req-1", 1_700_000_000_000_000, b'{"status":200}')
    answer_payload, _ = codec.pack_entries(45, [answer], head)
    # format 6: the same entries chained with SHA-256 (a store names its chain hash)
    _, sha_head = codec.pack_entries(41, ops, ref.ZERO_HASH, ref.CHAIN_SHA256)
    # format 7: a set with a deadline (op 4: deadline u64 ++ value) and an expiry (op 5)
    deadline = 1_700_000_060_000_000
    expiring = [
        (ref.OP_SET_EXPIRING, b"team-a", b"cfg/window", ref.expiring_value(deadline, b"on")),
        (ref.OP_EXPIRE, b"team-a", b"cfg/window", b""),
    ]
    expiry_payload, _ = codec.pack_entries(46, expiring, head)
    return {
        "golden_log_expiry_entries.bin": expiry_payload,
        "golden_record_expiring.bin": codec.encode_record(
            b"cfg/window", 46, b"team-a", b"on", False, True
        ),
        "golden_log_doc_entry.bin": doc_payload,
        "golden_log_answer_entry.bin": answer_payload,
        "golden_record_inline.bin": codec.encode_record(
            b"cfg/greeting", 7, b"team-a", b"hello", False
        ),
        "golden_record_chunked.bin": codec.encode_record(
            b"cfg/big", 2**40 + 3, b"team-b", b"x" * 5000, True
        ),
        "golden_log_payload.bin": payload,
        "golden_log_header.bin": header,
        "golden_chain_head.bin": head,
        "golden_chain_head_sha256.bin": sha_head,
    }


@pytest.mark.parametrize("name", sorted(_cases()))
def test_bytes_match_golden_file(name: str) -> None:
    assert CURRENT_FORMAT == GOLDEN_FORMAT, "format bumped: regenerate golden files"
    got = _cases()[name]
    path = DATA / name
    if os.environ.get("MERCURY_UPDATE_GOLDEN") == "1":
        path.write_bytes(got)
    assert path.read_bytes() == got, f"{name} drifted from the pinned format"


def test_golden_log_record_decodes_and_verifies() -> None:
    header = (DATA / "golden_log_header.bin").read_bytes()
    payload = (DATA / "golden_log_payload.bin").read_bytes()
    h = ref.decode_log_header(header)
    assert (h.first_seq, h.num_entries) == (41, 3)
    assert ref.log_crc_ok(header, payload)
    entries, head = codec.unpack_entries(payload, ref.ZERO_HASH)
    assert head == h.hash_head == (DATA / "golden_chain_head.bin").read_bytes()
    assert [e.key for e in entries] == [b"cfg/edge/ttl", b"cfg/edge/old", b"\x00bin\xff"]
    _, sha_head = codec.unpack_entries(payload, ref.ZERO_HASH, ref.CHAIN_SHA256)
    assert sha_head == (DATA / "golden_chain_head_sha256.bin").read_bytes()
    # plain SHA-256 over (previous link ++ entry), as any other tool computes it
    link, pos = ref.ZERO_HASH, 0
    for size in (16 + 6 + 12 + 3, 16 + 6 + 12, 16 + 5 + 16):  # the three entries' bytes
        link = hashlib.sha256(link + payload[pos : pos + size]).digest()
        pos += size
    assert pos == len(payload) and sha_head == link
