"""What every administration command (`mercury acl`, `mercury usage`) shares: the flags
that say which root to reach and with which admin token, the HTTP client they make, and
the reading of its answers.

Apart from the daemons' command modules on purpose: a short command run often (by
operators' scripts and by the test suite) imports only this and httpx, not the gateway,
the read API or uvicorn that `mercury root`'s flags pull in.
"""

from __future__ import annotations

import argparse
import os
import ssl
from pathlib import Path
from typing import Any

import httpx

from core.errors import ConfigError, GatewayError
from mercury.cliopts import http_url, positive_seconds


def client_args(p: argparse.ArgumentParser) -> None:
    """The flags naming the root to reach and how: --url, --admin-token-file, --ca,
    --timeout, -q."""
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


def client(args: argparse.Namespace) -> httpx.Client:
    """An HTTP client for the root `client_args` named, carrying the admin token."""
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


def check(resp: httpx.Response) -> Any:
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
