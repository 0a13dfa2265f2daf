"""Pure pieces of the security layer: the flags' checks and the range narrowing of read
tokens (property-tested: a narrowed range never reaches outside the token's keyspace or
the asked range)."""

from __future__ import annotations

import argparse
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import ConfigError
from mercury import tls
from reads.auth import allowed, narrow


def test_tls_flags_go_together() -> None:
    ns = argparse.Namespace(tls_cert="c", tls_key=None, tls_ca="a")
    with pytest.raises(ConfigError, match="all three"):
        tls.files_from_args(ns)
    assert tls.files_from_args(argparse.Namespace(tls_cert=None, tls_key=None, tls_ca=None)) is None


def test_loopback_and_the_plaintext_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert tls.is_loopback("127.0.0.1") and tls.is_loopback("::1") and tls.is_loopback("localhost")
    assert not tls.is_loopback("0.0.0.0") and not tls.is_loopback("10.1.2.3")
    with caplog.at_level(logging.WARNING, logger="mercury.tls"):
        tls.warn_plaintext([("gateway", ("0.0.0.0", 8080)), ("kt", ("127.0.0.1", 1978))], False)
        tls.warn_plaintext([("gateway", ("0.0.0.0", 8080))], True)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "gateway listens on 0.0.0.0:8080 without TLS" in lines[0]


def test_tokenless_listeners_beyond_loopback_need_the_flag() -> None:
    tls.check_tokenless_listeners([("kt", ("127.0.0.1", 1)), ("memcached", None)], False)
    with pytest.raises(ConfigError, match="--allow-unauthenticated-reads"):
        tls.check_tokenless_listeners([("memcached", ("0.0.0.0", 11211))], False)
    tls.check_tokenless_listeners([("memcached", ("0.0.0.0", 11211))], True)


_bytes = st.lists(st.sampled_from([b"a", b"b", b"\xff"]), max_size=4).map(b"".join)


@given(
    spaces=st.lists(_bytes.filter(bool), min_size=1, max_size=3).map(tuple),
    start=_bytes,
    end=st.none() | _bytes,
    key=_bytes,
)
def test_narrowed_range_is_exactly_the_readable_part_of_the_asked_range(
    spaces: tuple[bytes, ...], start: bytes, end: bytes | None, key: bytes
) -> None:
    if end is not None and end <= start:
        return
    part = narrow(spaces, start, end)
    if part is None:
        return  # refused (403): nothing is read
    lo, hi = part
    inside = lo <= key and (hi is None or key < hi)
    asked = start <= key and (end is None or key < end)
    # Never a key outside the asked range or the token's keyspaces, and none left out.
    assert inside == (asked and allowed(spaces, key))
