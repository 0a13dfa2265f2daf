"""TLS contexts built from files: one set of flags (`--tls-cert`, `--tls-key`, `--tls-ca`).

Trust model: a deployment runs its own CA. Every node holds a certificate signed by it;
replication is mutual TLS (a source accepts only peers presenting a certificate signed by
the CA, a replica verifies its source's against the same CA), so a peer is identified by
the CA's signature, not by a host name (nodes are reached by address; certificates need
no matching name). The CA's signature is not enough to replicate: the certificate must
also carry a replication role (`net.certs`: ``root`` or ``replica``), which both ends
check after the handshake (`check_replication_peer`): a consumer's certificate, signed by
the same CA, neither pulls the data set nor serves as a source. A certificate without any
role (made before roles) passes only with `TlsFiles.allow_roleless` (the
``--tls-allow-roleless`` flag), and each such peer is logged as a warning. The HTTP
listeners serve HTTPS with the same certificate; HTTP clients authenticate with bearer
tokens, not certificates.

`TlsContexts` holds the current contexts and `reload()` re-reads the files (on SIGHUP):
connections made afterwards use the new certificate, key and CA; open ones keep theirs.
A reload that fails (a missing or mismatched file) keeps the old contexts and raises.
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass

from net import certs

log = logging.getLogger("mercury.tls")

#: Oldest protocol accepted on any link.
MIN_VERSION = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of a node: its certificate (chain), its private key and the CA."""

    cert: str
    key: str
    ca: str
    #: Accept replication peers whose certificate carries no role (made before roles),
    #: logging each: a migration aid, never a default.
    allow_roleless: bool = False


class PeerRoleError(OSError):
    """A replication peer's certificate, though signed by our CA, lacks a replication
    role. An OSError, so a replica's connect loop logs it and retries like any refused
    connection; `reason` is the `mercury_repl_refused_total` label."""

    def __init__(self, detail: str, reason: str = "wrong_role") -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def check_replication_peer(der: bytes | None, *, allow_roleless: bool, peer: str) -> str:
    """The role of a replication peer's certificate (`der`, from the finished handshake),
    or PeerRoleError when it may not replicate: only ``root`` and ``replica`` may, on
    either end of a link. `peer` says who it is in messages (e.g. "source 10.0.0.1:7070").
    A certificate without a role passes only with `allow_roleless`, as "none", logged."""
    if der is None:
        raise PeerRoleError(f"{peer} presented no certificate", reason="no_certificate")
    try:
        role = certs.role_of(der)
    except ValueError as err:
        raise PeerRoleError(f"{peer}: {err}") from err
    if role is None:
        if not allow_roleless:
            raise PeerRoleError(
                f"{peer}'s certificate carries no role; replication needs "
                f"{certs.ROLE_URI_PREFIX}root or {certs.ROLE_URI_PREFIX}replica "
                "(reissue it with `mercury certs --role`, or pass --tls-allow-roleless)",
                reason="no_role",
            )
        log.warning(
            "%s's certificate carries no role, accepted because of --tls-allow-roleless: "
            "reissue it with `mercury certs --role root|replica`",
            peer,
        )
        return "none"
    if role not in certs.REPLICATION_ROLES:
        raise PeerRoleError(
            f"{peer}'s certificate has role {role!r}; replication needs root or replica"
        )
    return role


def server_context(files: TlsFiles, *, require_client_cert: bool) -> ssl.SSLContext:
    """A server context presenting `files.cert`; with `require_client_cert`, a peer must
    present a certificate signed by `files.ca` (mutual TLS) or the handshake fails."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    ctx.load_cert_chain(files.cert, files.key)
    if require_client_cert:
        ctx.load_verify_locations(cafile=files.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(files: TlsFiles) -> ssl.SSLContext:
    """A client context presenting `files.cert` and verifying the server against
    `files.ca` alone (not the system's CAs: only our CA identifies a Mercury node)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = MIN_VERSION
    ctx.check_hostname = False  # identity = signed by our CA; nodes are dialled by address
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=files.ca)
    ctx.load_cert_chain(files.cert, files.key)
    return ctx


class TlsContexts:
    """The replication link's current contexts (server side: mutual TLS; client side)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self.generation = 0
        self.server, self.client = self._build()

    def _build(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        return server_context(self.files, require_client_cert=True), client_context(self.files)

    def reload(self) -> None:
        """Re-read the files; new connections use them. Raises (ssl.SSLError, OSError)
        and keeps the current contexts when they do not load."""
        server, client = self._build()
        with self._lock:
            self.server, self.client = server, client
            self.generation += 1


def reload_in_place(ctx: ssl.SSLContext, files: TlsFiles) -> None:
    """Load a new certificate and key into an existing server context (an HTTP server
    that keeps one context object for its life: its new connections present them)."""
    ctx.load_cert_chain(files.cert, files.key)
