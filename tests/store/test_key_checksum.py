"""Key bytes are covered by the value record's CRC, `verify` walks the data in key order,
and `mercury verify` answers a damaged file with a report (exit 1) or a clean bill (0),
never a traceback."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from core.errors import CRCError
from store import layout
from store.check import check
from store.ops import SET, Op
from store.store import CURRENT_FORMAT, Store, read_format_version
from testkit.procs import run_mercury

KEYS = [f"key-{i:04d}-UNIQUEKEYBYTES".encode() for i in range(200)]


def _make(d: str) -> None:
    with Store.create(d, sync=True) as s:
        s.apply(
            [Op(SET, k, b"value-%d" % i + b"x" * (i % 7) * 600, "p") for i, k in enumerate(KEYS)]
        )


def _flip_key_in_data(path: str, key: bytes, at: int) -> bytes:
    """Flip byte `at` of `key` where it sits in a data leaf (the key followed by its value
    record: tag 0x01, flags); returns the damaged key."""
    data = bytearray(Path(path).read_bytes())
    pos = data.find(key + b"\x01")
    assert pos >= 0, "key not found in a data leaf"
    data[pos + at] ^= 0x01
    Path(path).write_bytes(bytes(data))
    damaged = bytearray(key)
    damaged[at] ^= 0x01
    return bytes(damaged)


def test_a_flipped_key_byte_fails_the_crc_on_read_and_in_verify(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    _make(d)
    key = KEYS[100]
    # The last byte: the damaged key still sorts between its neighbours, so only a
    # checksum over the key can tell.
    damaged = _flip_key_in_data(layout.data_file(d), key, len(key) - 1)
    with Store.open(d) as s:
        assert s.get(key) is None  # the key is gone from the tree...
        with pytest.raises(CRCError):
            s.get(damaged)  # ...and the bytes now under another key are not served
        report = check(s)
        assert not report.ok
        assert any(repr(damaged) in p and "CRC" in p for p in report.problems), report.problems


def test_verify_reports_keys_out_of_order(tmp_path: Path) -> None:
    d = str(tmp_path / "s")
    _make(d)
    key = KEYS[100]
    # The first differing byte ('1' of 0100 -> '0'): the key now sorts before its left
    # neighbours although it sits after them in the tree.
    _flip_key_in_data(layout.data_file(d), key, key.index(b"1"))
    with Store.open(d) as s:
        report = check(s)
    assert not report.ok
    assert any("order" in p for p in report.problems), report.problems


def test_verify_never_crashes_on_random_damage(tmp_path: Path) -> None:
    """Flip random bytes of copies of a store: `mercury verify` exits 0 or 1, with no
    traceback, every time. Bounded: 12 copies with 1 to 8 flips anywhere, 8 with flips in
    page headers (what LMDB's own walk trips on); a fixed seed, so the damage is the same on
    every run and most copies must be reported (the test cannot pass vacuously)."""
    src = tmp_path / "src"
    _make(str(src))
    rng = random.Random(20261124)
    size = Path(layout.data_file(str(src))).stat().st_size
    codes = []
    for n in range(20):
        d = tmp_path / f"copy{n}"
        shutil.copytree(src, d)
        f = Path(layout.data_file(str(d)))
        data = bytearray(f.read_bytes())
        for _ in range(rng.randint(1, 8)):
            # skip the two meta pages most of the time: damage there is refused at open
            at = rng.randrange(0 if rng.random() < 0.1 else 8192, size)
            if n >= 12:
                at = (at & ~4095) + rng.randrange(16)  # a page header
            data[at] ^= 1 << rng.randrange(8)
        f.write_bytes(bytes(data))
        r = run_mercury("verify", str(d), timeout=120)
        assert r.returncode in (0, 1), (n, r.returncode, r.stdout[-2000:], r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (n, r.stderr[-3000:])
        if r.returncode == 1:
            assert "problem" in r.stdout, (n, r.stdout[-2000:])
        codes.append(r.returncode)
    assert codes[:12].count(1) >= 8 and codes[12:].count(1) >= 1, codes


def _as_format_3(d: str) -> None:
    """Rewrite every record's CRC the format-3 way (key left out) and mark the store 3."""
    import struct
    import zlib

    from store import chunks
    from store.format import FLAG_CHUNKED, decode_record_header
    from store.layout import K_FORMAT, U32

    with Store.open(d) as s, s.env.begin(write=True) as txn:
        for k, v in list(txn.cursor(db=s.dbs.data)):
            rec = bytes(v)
            h = decode_record_header(rec)
            if h.flags & FLAG_CHUNKED:
                value = chunks.get(txn, s.dbs.chunks, chunks.VALUE_NS, h.seq, h.vlen)
                assert value is not None
            else:
                value = rec[h.value_offset :]
            crc = zlib.crc32(value, zlib.crc32(rec[18 : h.value_offset], zlib.crc32(rec[:14])))
            txn.put(bytes(k), rec[:14] + struct.pack("<I", crc) + rec[18:], db=s.dbs.data)
        txn.put(K_FORMAT, U32.pack(3), db=s.dbs.meta)


def test_migration_0004_re_signs_every_record_and_keeps_the_data(tmp_path: Path) -> None:
    from migrations.runner import migrate

    d = str(tmp_path / "s")
    _make(d)
    with Store.open(d) as s:
        before = {k: s.get(k) for k in KEYS}
    _as_format_3(d)
    assert read_format_version(d) == 3
    with Store.open(d, check_format=False) as s:
        assert not check(s).ok  # format-3 CRCs fail the format-4 check
    assert [st.name for st in migrate(d)] == [
        "0004_key_checksum",
        "0005_root_state_in_log",
        "0006_chain_hash",
        "0007_expiry",
    ]
    assert read_format_version(d) == CURRENT_FORMAT
    with Store.open(d) as s:
        assert {k: s.get(k) for k in KEYS} == before
        assert check(s).ok, check(s).problems


def test_migration_0004_refuses_to_re_sign_a_corrupt_record(tmp_path: Path) -> None:
    from core.errors import CorruptionError
    from migrations.runner import migrate

    d = str(tmp_path / "s")
    _make(d)
    _as_format_3(d)
    data = bytearray(Path(layout.data_file(d)).read_bytes())
    at = data.find(b"value-150")
    while at >= 0:  # in the data leaf (and in the log's copy, which 0004 does not read)
        data[at + 6] ^= 0x01
        at = data.find(b"value-150", at + 1)
    Path(layout.data_file(d)).write_bytes(bytes(data))
    with pytest.raises(CorruptionError, match="not re-signed"):
        migrate(d)
    assert read_format_version(d) == 3  # nothing changed
