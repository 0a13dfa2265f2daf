"""A deployment's CA and its nodes' certificates (`mercury certs`), with `cryptography`.

For a development or small deployment that has no PKI of its own: one CA, and per node a
key and a certificate the CA signed, usable on both sides of every link (server and client
authentication: replication is mutual TLS, and the same certificate serves HTTPS). Each
node's certificate names the node (DNS), ``localhost`` and ``127.0.0.1``, plus any extra
names given, so HTTPS clients that check the host name can reach it by those names.

Idempotent: an existing CA is reused and an existing node's files are left alone, so a
one-shot service (the compose topology's ``certs``) can run it on every start and only
adds what is missing. The CA's key is written to its own directory (`ca_key_dir`), so it
can stay off the nodes: they only ever need ``ca.crt`` and their own pair.

Keys are ECDSA P-256 (fast handshakes); files holding a key are created 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from core.errors import ConfigError

#: Validity of a node's certificate; the CA's is ten times that.
NODE_DAYS = 397
CA_NAME = "Mercury deployment CA"


def _write(path: Path, data: bytes, secret: bool) -> None:
    """Write `data` to `path` atomically (0600 when `secret`, else 0644)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _names(node: str, extra: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in dict.fromkeys([node, "localhost", "127.0.0.1", *extra]):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def _load_ca(ca_crt: Path, ca_key: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(ca_crt.read_bytes())
    key = serialization.load_pem_private_key(ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{ca_key} is not an ECDSA key made by `mercury certs`")
    return cert, key


def _new_ca(now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=10 * NODE_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _node_cert(
    node: str,
    extra: Iterable[str],
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=NODE_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_names(node, extra)), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def ensure(
    out: Path, nodes: Iterable[str], *, ca_key_dir: Path | None = None, san: Iterable[str] = ()
) -> list[str]:
    """Make what is missing of `out`/ca.crt (its key in `ca_key_dir`/ca.key, default `out`)
    and `out`/<node>.crt + .key for each node; return the files written."""
    key_dir = ca_key_dir or out
    out.mkdir(parents=True, exist_ok=True)
    key_dir.mkdir(parents=True, exist_ok=True)
    ca_crt, ca_key_path = out / "ca.crt", key_dir / "ca.key"
    now = datetime.datetime.now(datetime.UTC)
    written: list[str] = []
    if ca_crt.exists() and ca_key_path.exists():
        ca, ca_key = _load_ca(ca_crt, ca_key_path)
    elif ca_crt.exists() or ca_key_path.exists():
        raise ConfigError(
            f"found only one of {ca_crt} and {ca_key_path}",
            hint="restore the other, or remove both to make a new CA (and new node certificates)",
        )
    else:
        ca, ca_key = _new_ca(now)
        _write(ca_key_path, _key_pem(ca_key), secret=True)
        _write(ca_crt, ca.public_bytes(serialization.Encoding.PEM), secret=False)
        written += [str(ca_crt), str(ca_key_path)]
    extra = list(san)
    for node in nodes:
        if not node or "/" in node or node.startswith("."):
            raise ConfigError(f"node name {node!r} cannot name a file")
        crt, key_path = out / f"{node}.crt", out / f"{node}.key"
        if crt.exists() and key_path.exists():
            continue
        cert, key = _node_cert(node, extra, ca, ca_key, now)
        _write(key_path, _key_pem(key), secret=True)
        _write(crt, cert.public_bytes(serialization.Encoding.PEM), secret=False)
        written += [str(crt), str(key_path)]
    return written
