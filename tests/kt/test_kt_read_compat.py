"""What real KT clients tripped over on reads: the TSV-RPC column encoding KT picks
(`checkmapenc`), and database names other than `0` accepted as aliases."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kt import protocol as kt
from kt.server import KtHandler
from store.ops import SET, Op
from store.store import Store

_UNRESERVED = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.!~*'()"


def checkmapenc(items: dict[bytes, bytes]) -> str:
    """Kyoto Tycoon's `checkmapenc` (ktutil.h), transcribed: "" (raw), "B" or "U"."""
    binary = False
    blen = ulen = 0
    for col in (c for kv in items.items() for c in kv):
        if len(col) > 255:
            col = col[:255]
            binary = True
        blen += len(col) * 6 // 4 + 3
        for c in col:
            if c < 0x20 or c == 0x7F:
                binary = True
            ulen += 1 if c in _UNRESERVED else 3
    if not binary:
        return ""
    return "B" if blen < ulen else "U"


@given(st.dictionaries(st.binary(max_size=300), st.binary(max_size=300), max_size=6))
def test_column_encoding_is_the_one_kt_picks(items: dict[bytes, bytes]) -> None:
    body, ctype = kt.encode_tsv(items)
    want = checkmapenc(items)
    assert ctype == "text/tab-separated-values" + (f"; colenc={want}" if want else "")
    assert kt.decode_tsv_response(body, ctype) == items


def test_a_short_binary_value_picks_url_encoding_as_kt_does() -> None:
    # KT estimates Base64 as 4 + 7 = 11 bytes (size*6/4+3 per column), URL as 1 + 9 = 10;
    # real Base64 would be 4 + 4 = 8, which is not what KT compares
    _, ctype = kt.encode_tsv({b"k": b"\x01\x02\x03"})
    assert ctype.endswith("colenc=U")


def test_database_aliases(store: Store) -> None:
    store.apply([Op(SET, b"k", b"v", "p")])
    h = KtHandler(store, db_aliases=(b"casket.kch", b"%"))
    for path in (b"/casket.kch/k", b"/%25/k", b"/0/k"):
        out, _ = h.step(bytearray(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n"))
        assert out.startswith(b"HTTP/1.1 200"), (path, out)
    out, _ = h.step(bytearray(b"GET /other.kch/k HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert out.startswith(b"HTTP/1.1 400")
    out, _ = h.step(bytearray(b"GET /rpc/get?DB=casket.kch&key=k HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"value\tv\n")
    out, _ = h.step(bytearray(b"GET /rpc/get?DB=nope&key=k HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert out.startswith(b"HTTP/1.1 400")
