"""Security flags of `mercury root` and `mercury replica` (see docs/security.md): TLS and
its SIGHUP reload, the warning for a listener open beyond loopback without TLS, read
tokens (`--read-auth`) and the refusal to open the token-less KT and memcached listeners
beyond loopback (unless `--allow-unauthenticated-reads`).

One set of flags, `--tls-cert F --tls-key F --tls-ca F`, turns on HTTPS on the HTTP
listener (uvicorn's ssl settings) and mutual TLS on every replication link. SIGHUP re-reads
the files: the HTTP server's one context gets the new certificate and key in place, the
replication contexts are rebuilt; new connections use them, open ones keep theirs.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import ssl
from collections.abc import Callable, Iterable
from pathlib import Path

from core.errors import ConfigError
from net import certs
from net.tlsconf import TlsContexts, TlsFiles, reload_in_place

log = logging.getLogger("mercury.tls")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`--tls-cert`, `--tls-key`, `--tls-ca` (all three or none)."""
    g = p.add_argument_group("TLS (all three or none; SIGHUP re-reads the files)")
    g.add_argument("--tls-cert", metavar="F", help="this node's certificate chain (PEM)")
    g.add_argument("--tls-key", metavar="F", help="this node's private key (PEM)")
    g.add_argument(
        "--tls-ca",
        metavar="F",
        help="the deployment's CA (PEM): replication peers must present a certificate it "
        "signed carrying the root or replica role (mutual TLS); HTTP listeners serve HTTPS",
    )
    g.add_argument(
        "--tls-allow-roleless",
        action="store_true",
        help="also accept replication peers whose certificate carries no role (made before "
        "`mercury certs --role`), logging a warning for each: a migration aid",
    )


def add_read_arguments(p: argparse.ArgumentParser, *, read_auth: bool) -> None:
    """`--allow-unauthenticated-reads`, and `--read-auth` when `read_auth` (root and
    replica: without it a replica's reads are open and the root's take only producer and
    admin tokens)."""
    if read_auth:
        p.add_argument(
            "--read-auth",
            action="store_true",
            help="HTTP reads (kv, get_bulk, range, watch) need a bearer token (a producer's "
            "or consumer's from the ACL; on the root the admin token too) and see only its "
            "keyspaces",
        )
    p.add_argument(
        "--allow-unauthenticated-reads",
        action="store_true",
        help="let the KT and memcached listeners (which carry no token) bind a non-loopback "
        "address",
    )


def check_tokenless_listeners(
    listeners: Iterable[tuple[str, tuple[str, int] | None]], allowed: bool
) -> None:
    """ConfigError for a token-less listener bound beyond loopback unless `allowed`: anyone
    reaching it could read every key."""
    if allowed:
        return
    for name, addr in listeners:
        if addr is not None and not is_loopback(addr[0]):
            raise ConfigError(
                f"the {name} listener carries no token, so it may not listen on "
                f"{addr[0]}:{addr[1]}",
                hint="bind it to 127.0.0.1, or pass --allow-unauthenticated-reads",
            )


def files_from_args(
    args: argparse.Namespace, roles: frozenset[str] = certs.REPLICATION_ROLES
) -> TlsFiles | None:
    """The TLS files named by the flags, None without them; ConfigError for a partial set,
    and for a certificate whose role is not one of `roles` (a node started with a
    consumer's certificate; an HA candidate, which replicates as a standby, needs
    ``root``): its peers would refuse it anyway, with a less clear message."""
    given = (args.tls_cert, args.tls_key, args.tls_ca)
    if not any(given):
        return None
    if not all(given):
        raise ConfigError("--tls-cert, --tls-key and --tls-ca go together: give all three")
    roleless = bool(getattr(args, "tls_allow_roleless", False))
    if roleless:
        log.warning(
            "--tls-allow-roleless: replication peers whose certificate carries no role are "
            "accepted (each logged); reissue them with `mercury certs --role root|replica`"
        )
    _check_own_role(Path(args.tls_cert), roles, roleless)
    return TlsFiles(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca, allow_roleless=roleless)


def _check_own_role(cert: Path, roles: frozenset[str], roleless: bool) -> None:
    try:
        role = certs.role_of_file(cert)
    except (OSError, ValueError):
        return  # unreadable or malformed: loading the TLS context says so, as before
    if role is None and roleless:
        return
    if role not in roles:
        need = " or ".join(sorted(roles))
        raise ConfigError(
            f"{cert} carries role {role or 'none'}; this node needs {need}",
            hint=f"issue it with `mercury certs OUT --node NAME --role {'|'.join(sorted(roles))}`"
            + ("" if role is not None else ", or pass --tls-allow-roleless"),
        )


def uvicorn_ssl(files: TlsFiles | None) -> dict[str, object]:
    """uvicorn.Config keyword arguments serving HTTPS with `files` (nothing without).

    HTTP clients authenticate with bearer tokens, so no client certificate is asked for.
    """
    if files is None:
        return {}
    return {"ssl_certfile": files.cert, "ssl_keyfile": files.key, "ssl_ca_certs": files.ca}


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and `localhost`; a name or wildcard is not loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_plaintext(listeners: Iterable[tuple[str, tuple[str, int] | None]], tls: bool) -> None:
    """Log a warning for each listener bound beyond loopback without TLS."""
    if tls:
        return
    for name, addr in listeners:
        if addr is not None and not is_loopback(addr[0]):
            log.warning(
                "%s listens on %s:%d without TLS: anyone on that network can read (and, for "
                "replication, impersonate) this node; give --tls-cert/--tls-key/--tls-ca",
                name,
                addr[0],
                addr[1],
            )


class TlsReloader:
    """A service re-reading the TLS files on SIGHUP (on the process's event loop)."""

    name = "tls-reload"

    def __init__(
        self,
        files: TlsFiles,
        contexts: TlsContexts | None,
        http_context: Callable[[], ssl.SSLContext | None],
        also: Callable[[], None] = lambda: None,
    ) -> None:
        self.files = files
        self.contexts = contexts
        self.http_context = http_context
        self.also = also
        self.reloads = 0

    async def start(self) -> None:
        """Handle SIGHUP from now on."""
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload)

    async def stop(self) -> None:
        """Stop handling SIGHUP."""
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)

    def reload(self) -> None:
        """Re-read the files; a failure keeps the current ones and is logged."""
        try:
            if self.contexts is not None:
                self.contexts.reload()
            ctx = self.http_context()
            if ctx is not None:
                reload_in_place(ctx, self.files)
        except (OSError, ssl.SSLError) as err:
            log.error("TLS reload failed, keeping the current certificates: %s", err)
            return
        self.also()
        self.reloads += 1
        log.info("TLS certificates re-read from %s", self.files.cert)
