"""A deployment's CA and its nodes' certificates (`mercury certs`), with `cryptography`.

For a development or small deployment that has no PKI of its own: one CA, and per node a
key and a certificate the CA signed. Each certificate carries a *role* (`ROLES`) as a SAN
URI ``urn:mercury:role:<role>`` that the replication transport reads back from the peer's
certificate (`role_of`): being signed by the CA is not enough to replicate.

- ``root`` and ``replica``: a node; server and client authentication (replication is
  mutual TLS both ways, and the same certificate serves HTTPS); a replication source
  accepts a downstream peer, and a replica an upstream one, only with one of these roles.
  HA candidates (which stream from the leader as standbys) are ``root``.
- ``consumer``: client authentication only (no serverAuth usage, so no TLS client takes it
  for a server); it authenticates HTTPS reads (with a read token) and nothing else.

Each node's certificate names the node (DNS), ``localhost`` and ``127.0.0.1``, plus any
extra names given, so HTTPS clients that check the host name can reach it by those names.

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
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from core.errors import ConfigError

#: Validity of a node's certificate; the CA's is ten times that.
NODE_DAYS = 397
CA_NAME = "Mercury deployment CA"

ROOT: Final = "root"
REPLICA: Final = "replica"
CONSUMER: Final = "consumer"
#: Every role a certificate can carry.
ROLES: Final = (ROOT, REPLICA, CONSUMER)
#: The roles that may take part in replication, on either end of a link.
REPLICATION_ROLES: Final = frozenset({ROOT, REPLICA})
#: A role is this URI prefix plus its name, in the certificate's subjectAltName.
ROLE_URI_PREFIX: Final = "urn:mercury:role:"


def role_uri(role: str) -> str:
    """The SAN URI naming `role` (ValueError for a role not in `ROLES`)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    return ROLE_URI_PREFIX + role


def role_of(der: bytes) -> str | None:
    """The role a DER certificate carries: None without a role URI (a certificate made
    before roles, or by another PKI); the URI's text for a name outside `ROLES` (so a
    check of membership refuses it); ValueError for two different roles in one."""
    cert = x509.load_der_x509_certificate(der)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    found = {
        uri[len(ROLE_URI_PREFIX) :]
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(ROLE_URI_PREFIX)
    }
    if len(found) > 1:
        raise ValueError(f"certificate carries several roles: {', '.join(sorted(found))}")
    return found.pop() if found else None


def role_of_file(path: Path) -> str | None:
    """`role_of` the first certificate of a PEM file."""
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return role_of(cert.public_bytes(serialization.Encoding.DER))


def _write(path: Path, data: bytes, secret: bool) -> None:
    """Write `data` to `path` atomically (0600 when `secret`, else 0644)."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """`key` as unencrypted PKCS#8 PEM (its file is written 0600)."""
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _names(node: str, extra: Iterable[str], role: str) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role_uri(role))]
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


def node_cert(
    node: str,
    role: str,
    extra: Iterable[str],
    ca: x509.Certificate,
    ca_key: CertificateIssuerPrivateKeyTypes,
    now: datetime.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new key and a certificate for `node` in `role`, signed by `ca`/`ca_key`."""
    now = now or datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role in REPLICATION_ROLES:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
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
        .add_extension(x509.SubjectAlternativeName(_names(node, extra, role)), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def ensure(
    out: Path,
    nodes: Mapping[str, str],
    *,
    ca_key_dir: Path | None = None,
    san: Iterable[str] = (),
) -> list[str]:
    """Make what is missing of `out`/ca.crt (its key in `ca_key_dir`/ca.key, default `out`)
    and `out`/<node>.crt + .key for each node of `nodes` (node -> role); return the files
    written. An existing node certificate with another role (or none) is a ConfigError:
    a role is never changed behind the operator's back."""
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
        _write(ca_key_path, key_pem(ca_key), secret=True)
        _write(ca_crt, ca.public_bytes(serialization.Encoding.PEM), secret=False)
        written += [str(ca_crt), str(ca_key_path)]
    extra = list(san)
    for node, role in nodes.items():
        if not node or "/" in node or node.startswith("."):
            raise ConfigError(f"node name {node!r} cannot name a file")
        if role not in ROLES:
            raise ConfigError(f"unknown role {role!r} for {node}: one of {', '.join(ROLES)}")
        crt, key_path = out / f"{node}.crt", out / f"{node}.key"
        if crt.exists() and key_path.exists():
            had = role_of_file(crt)
            if had != role:
                raise ConfigError(
                    f"{crt} exists with role {had or 'none'}, not {role}",
                    hint=f"remove {crt} and {key_path} to issue it again with role {role}",
                )
            continue
        cert, key = node_cert(node, role, extra, ca, ca_key, now)
        _write(key_path, key_pem(key), secret=True)
        _write(crt, cert.public_bytes(serialization.Encoding.PEM), secret=False)
        written += [str(crt), str(key_path)]
    return written
