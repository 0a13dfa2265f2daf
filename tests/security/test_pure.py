"""Pure pieces of the security layer: the flags' checks, the range narrowing of read
tokens (property-tested: a narrowed range never reaches outside the token's keyspace or
the asked range), ranges read across several keyspaces (property-tested against the
brute-force filter, page by page), and `mercury certs`."""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import ConfigError
from mercury import tls
from net import certs
from net.tlsconf import (
    PeerRoleError,
    TlsFiles,
    check_replication_peer,
    client_context,
    server_context,
)
from reads import ranges
from reads.auth import allowed, narrow
from store.ops import Value


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


class _ListReader:
    """A sorted in-memory `RangeReader` (the store's scan contract, brute force)."""

    def __init__(self, keys: list[bytes]) -> None:
        self.keys = sorted(set(keys))

    def scan(
        self,
        *,
        start: bytes = b"",
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        keys_only: bool = False,
    ) -> Iterator[tuple[bytes, Value | None]]:
        n = 0
        for k in self.keys:
            if k < start or (end is not None and k >= end):
                continue
            if prefix is not None and not k.startswith(prefix):
                continue
            if limit is not None and n >= limit:
                return
            n += 1
            yield k, None


@settings(max_examples=300, deadline=None)
@given(
    keys=st.lists(_bytes.filter(bool), max_size=25),
    spaces=st.lists(_bytes, min_size=1, max_size=4).map(tuple),
    bounds=st.one_of(
        st.tuples(_bytes.filter(bool)).map(lambda t: ranges.make_spec(prefix=t[0])),
        st.tuples(_bytes, st.none() | _bytes)
        .filter(lambda t: t[1] is None or t[0] < t[1])
        .map(lambda t: ranges.make_spec(start=t[0], end=t[1])),
    ),
    limit=st.integers(1, 4),
)
def test_range_in_several_keyspaces_is_the_brute_force_filter(
    keys: list[bytes],
    spaces: tuple[bytes, ...],
    bounds: ranges.RangeSpec,
    limit: int,
) -> None:
    """Walking a range page by page through a token's keyspaces (cursors included) returns
    exactly the keys of the range inside any of them, in order, each once; "more" is only
    ever said when a readable key follows."""
    inner = _ListReader(keys)
    reader = ranges.KeyspaceReader(inner, spaces)
    expected = [
        k
        for k in inner.keys
        if bounds.start <= k
        and (bounds.end is None or k < bounds.end)
        and (bounds.prefix is None or k.startswith(bounds.prefix))
        and allowed(spaces, k)
    ]
    got: list[bytes] = []
    after: bytes | None = None
    for _ in range(len(keys) + 2):
        items, more = ranges.read_page(reader, bounds, after, limit, keys_only=True)
        assert items or after is None, "the previous page said more, but none followed"
        got += [k for k, _ in items]
        assert all(allowed(spaces, k) for k, _ in items)
        if not more:
            break
        assert items, "more said with an empty page"
        cursor = ranges.encode_cursor(bounds, items[-1][0])
        after = ranges.decode_cursor(bounds, cursor)
    assert got == expected
    # The parts are disjoint, ordered and inside both the range and the keyspaces.
    parts = ranges.clip(spaces, bounds.start, bounds.end)
    for (_, hi), (lo2, _) in itertools.pairwise(parts):
        assert hi is not None and hi <= lo2


def test_certs_makes_only_what_is_missing(tmp_path: Path) -> None:
    out, keys = tmp_path / "certs", tmp_path / "ca"
    nodes = {"root": "root", "r1": "replica"}
    made = certs.ensure(out, nodes, ca_key_dir=keys, san=["10.0.0.7", "node.example"])
    assert {Path(f).name for f in made} == {
        "ca.crt", "ca.key", "root.crt", "root.key", "r1.crt", "r1.key",
    }  # fmt: skip
    assert not (out / "ca.key").exists() and (keys / "ca.key").exists()
    for secret in (keys / "ca.key", out / "root.key", out / "r1.key"):
        assert secret.stat().st_mode & 0o077 == 0
    assert certs.ensure(out, nodes, ca_key_dir=keys) == []  # idempotent
    again = certs.ensure(out, {"root": "root", "r2": "replica"}, ca_key_dir=keys)
    assert {Path(f).name for f in again} == {"r2.crt", "r2.key"}  # the same CA signs it
    # Each certificate works on both ends of a mutual-TLS link with the CA alone.
    files = TlsFiles(str(out / "r2.crt"), str(out / "r2.key"), str(out / "ca.crt"))
    server_context(files, require_client_cert=True)
    client_context(files)
    leaf = x509.load_pem_x509_certificate((out / "root.crt").read_bytes())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "node.example" in names.get_values_for_type(x509.DNSName)
    assert ipaddress.ip_address("10.0.0.7") in names.get_values_for_type(x509.IPAddress)
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    leaf.verify_directly_issued_by(ca)
    # Each carries its role, read back from the certificate; a role is never changed
    # behind the operator's back.
    assert certs.role_of_file(out / "root.crt") == "root"
    assert certs.role_of_file(out / "r1.crt") == "replica"
    with pytest.raises(ConfigError, match="exists with role replica, not consumer"):
        certs.ensure(out, {"r1": "consumer"}, ca_key_dir=keys)
    (keys / "ca.key").unlink()
    with pytest.raises(ConfigError, match="only one of"):
        certs.ensure(out, {"r3": "replica"}, ca_key_dir=keys)
    with pytest.raises(ConfigError, match="cannot name a file"):
        certs.ensure(tmp_path / "x", {"../evil": "replica"})


def test_replication_needs_a_replication_role(tmp_path: Path) -> None:
    """Only root and replica certificates replicate; a consumer's, an unknown role, two
    roles and (without the legacy flag) none are refused; a consumer's is client-only."""
    out = tmp_path / "certs"
    certs.ensure(out, {"root": "root", "r": "replica", "c": "consumer"})
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)

    def der(name: str) -> bytes:
        cert = x509.load_pem_x509_certificate((out / f"{name}.crt").read_bytes())
        return cert.public_bytes(serialization.Encoding.DER)

    def made(names: list[x509.GeneralName]) -> bytes:
        leaf, _ = certs.node_cert("x", "replica", [], ca, ca_key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(leaf.subject)
            .issuer_name(ca.subject)
            .public_key(leaf.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(leaf.not_valid_before_utc)
            .not_valid_after(leaf.not_valid_after_utc)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
        )
        return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.DER)

    def check(d: bytes | None, roleless: bool = False) -> str:
        return check_replication_peer(d, allow_roleless=roleless, peer="peer")

    assert check(der("root")) == "root" and check(der("r")) == "replica"
    with pytest.raises(PeerRoleError, match="role 'consumer'") as refused:
        check(der("c"))
    assert refused.value.reason == "wrong_role"
    uri = x509.UniformResourceIdentifier
    with pytest.raises(PeerRoleError, match="role 'admin'"):
        check(made([uri("urn:mercury:role:admin")]))
    with pytest.raises(PeerRoleError, match="several roles"):
        check(made([uri("urn:mercury:role:root"), uri("urn:mercury:role:consumer")]))
    roleless = made([x509.DNSName("localhost")])
    with pytest.raises(PeerRoleError, match="no role") as refused:
        check(roleless)
    assert refused.value.reason == "no_role"
    assert check(roleless, roleless=True) == "none"
    with pytest.raises(PeerRoleError, match="no certificate"):
        check(None, roleless=True)
    consumer = x509.load_der_x509_certificate(der("c"))
    usage = consumer.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]
