"""TLS contexts built from files: one set of flags (`--tls-cert`, `--tls-key`, `--tls-ca`).

Trust model: a deployment runs its own CA. Every node holds a certificate signed by it;
replication is mutual TLS (a source accepts only peers presenting a certificate signed by
the CA, a replica verifies its source's against the same CA), so a peer is identified by
the CA's signature, not by a host name (nodes are reached by address; certificates need
no matching name). The HTTP listeners serve HTTPS with the same certificate; HTTP clients
authenticate with bearer tokens, not certificates.

`TlsContexts` holds the current contexts and `reload()` re-reads the files (on SIGHUP):
connections made afterwards use the new certificate, key and CA; open ones keep theirs.
A reload that fails (a missing or mismatched file) keeps the old contexts and raises.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass

#: Oldest protocol accepted on any link.
MIN_VERSION = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of a node: its certificate (chain), its private key and the CA."""

    cert: str
    key: str
    ca: str


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
