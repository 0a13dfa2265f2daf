"""Commands of the gateway side: `root` (docs/api.md lists every command; `acl` is
`mercury/cmd_acl.py`, `usage` is `mercury/cmd_usage.py`)."""

from __future__ import annotations

import argparse
import os
import ssl
from pathlib import Path
from typing import Any

import httpx

from core.errors import ConfigError, GatewayError
from mercury import ha_flags, retention_flags, tls, upgrade
from mercury.cliopts import http_url, positive_seconds
from net import http_bounds
from net.tcp import add_listener_flags
from reads import watch


def register(sub: Any) -> None:
    """Add this module's subcommands to the `mercury` parser."""
    p = sub.add_parser(
        "root",
        help="run the root: gateway + store writer + replication source",
        description="Run the root node: the producer write gateway (HTTP), the store's only "
        "writer, the replication source and optional read listeners. SIGTERM commits and "
        "acknowledges the open batch, then exits.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="store directory (see `mercury init`)")
    p.add_argument("--listen", default="127.0.0.1:8080", help="gateway HTTP H:P")
    p.add_argument("--repl-listen", default="127.0.0.1:7070", help="replication source H:P")
    p.add_argument("--kt-listen", default=None, help="Kyoto Tycoon protocol listener H:P")
    p.add_argument(
        "--kt-producer",
        default=None,
        metavar="NAME",
        help="accept Kyoto Tycoon writes on --kt-listen as producer NAME (docs/kt-compat.md)",
    )
    p.add_argument(
        "--kt-db-alias",
        action="append",
        default=[],
        metavar="NAME",
        help="a KT database name accepted as database 0 (repeatable; e.g. casket.kch)",
    )
    p.add_argument(
        "--memcached-listen",
        default=None,
        metavar="H:P",
        help="memcached protocol: H:P, or unix:/path for local clients",
    )
    p.add_argument(
        "--unix-mode",
        default="660",
        metavar="OCTAL",
        help="file mode of a unix:/path --memcached-listen: who may connect (default 660)",
    )
    p.add_argument(
        "--memcached-producer",
        default=None,
        metavar="NAME",
        help="accept memcached writes on --memcached-listen as producer NAME (docs/kt-compat.md)",
    )
    p.add_argument(
        "--memcached-flags",
        action="store_true",
        help="memcached flags are each value's last 4 bytes (KT's memcached opts=f); "
        "with --memcached-producer, sets store them so",
    )
    add_listener_flags(p)
    http_bounds.add_flags(p)
    watch.add_flags(p)  # the watch streams' budget and bounds
    p.add_argument(
        "--batch-window-ms", type=float, default=500.0, help="batch window (default 500)"
    )
    p.add_argument(
        "--batch-max-ops", type=int, default=10_000, help="commit a batch early at N ops"
    )
    p.add_argument(
        "--batch-max-bytes", type=int, default=64 << 20, help="commit a batch early at N bytes"
    )
    p.add_argument(
        "--consumer-node",
        action="append",
        metavar="URL",
        help="consumer node named in the root's refusal of range reads (repeatable)",
    )
    p.add_argument(
        "--heartbeat-ms",
        type=int,
        default=1000,
        help="root heartbeat interval sent down the replication tree (default 1000)",
    )
    p.add_argument(
        "--max-bootstraps",
        type=int,
        default=1,
        help="concurrent snapshot transfers served to bootstrapping replicas (default 1)",
    )
    retention_flags.add_arguments(p)
    upgrade.add_arguments(p)
    tls.add_arguments(p)
    tls.add_read_arguments(p, read_auth=True)
    p.add_argument(
        "--switch-interval-ms",
        type=float,
        default=0.5,
        help="Python GIL switch interval (default 0.5 ms; Python's own default is 5)",
    )
    p.add_argument(
        "--no-fast-path",
        action="store_true",
        help="serve PUT/DELETE /v1/kv and POST /v1/batch through FastAPI's routing too",
    )
    p.add_argument(
        "--no-sync",
        action="store_true",
        help="do not fsync commits (tests and benchmarks only: acknowledged writes may be lost)",
    )
    ha_flags.add_arguments(p)
    p.set_defaults(func=_root)


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        type=http_url,
        default=os.environ.get("MERCURY_URL", "http://127.0.0.1:8080"),
        help="the root's gateway URL (default $MERCURY_URL or http://127.0.0.1:8080)",
    )
    env_file = os.environ.get("MERCURY_ADMIN_TOKEN_FILE")
    p.add_argument(
        "--admin-token-file",
        required=env_file is None,
        default=env_file,
        help="file holding the admin token, e.g. DATA_DIR/admin.token "
        "(default $MERCURY_ADMIN_TOKEN_FILE)",
    )
    p.add_argument("--ca", help="CA bundle (PEM) that verifies the root's TLS certificate")
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds per network wait (default 30)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only data and errors (no change lists, confirmations or notes): the exit "
        "status says what happened",
    )


def _root(args: argparse.Namespace) -> int:
    from mercury.root import run_root

    return run_root(args)


def _client(args: argparse.Namespace) -> httpx.Client:
    if "," in args.url:
        raise ConfigError(
            f"--url {args.url}: an administration command takes one URL",
            hint="the HA leader's (a standby answers with its leader's address)",
        )
    try:
        token = Path(args.admin_token_file).read_text().strip()
    except OSError as err:
        raise ConfigError(
            f"cannot read --admin-token-file {args.admin_token_file}: {err.strerror or err}",
            hint="the root's DATA_DIR/admin.token (written by `mercury init`)",
        ) from err
    return httpx.Client(
        base_url=args.url.rstrip("/"),
        headers={"Authorization": f"Bearer {token}"},
        timeout=getattr(args, "timeout", 30.0),
        verify=_verify(getattr(args, "ca", None)),
    )


def _verify(ca: str | None) -> ssl.SSLContext | bool:
    """--ca: that CA only; else the system's (and SSL_CERT_FILE's, which httpx honours)."""
    if not ca:
        return True
    try:
        return ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as err:
        raise ConfigError(f"cannot read --ca {ca}: {err.strerror or err}") from err


def _check(resp: httpx.Response) -> Any:
    """The JSON of a 2xx answer; any other answer is a `GatewayError` naming it (every
    problem of an ACL document listed, and the hint). A redirect is one too: an HA standby
    sends admin calls to its leader, whose address the error gives."""
    if 200 <= resp.status_code < 300:
        return resp.json()
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"detail": resp.text}
    lines = [f"{resp.request.method} {resp.request.url.path}: {resp.status_code} "
             f"{body.get('detail', '')}"]  # fmt: skip
    lines += [f"  - {e}" for e in body.get("errors", [])]
    hint = body.get("hint")
    if resp.status_code in (307, 308) and body.get("leader_url"):
        hint = f"this node does not lead its HA group: run again with --url {body['leader_url']}"
    raise GatewayError("\n".join(lines), hint=hint)
