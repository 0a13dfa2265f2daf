"""A small real HTTPS server for the watch contract (``GET /v1/watch?prefix=P&from_seq=N``,
NDJSON changes then heartbeats, 410 for a seq no longer retained), run by uvicorn on
127.0.0.1 in a thread, with mutual TLS from a throw-away CA made by the openssl CLI.

This server drops a stream mid-seq on purpose, so the SDK's resumption after a dropped
connection and its TLS options are tested over a real socket; the nodes' own
`GET /v1/watch` is tested with the SDK in `tests/reads/test_watch.py`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

import uvicorn

from testkit.wait import wait_until

Scope = dict[str, Any]


@dataclass
class Pki:
    """PEM files: a CA, a server certificate for 127.0.0.1, a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_pki(d: Path) -> Pki:
    """A CA and two leaf certificates signed by it (openssl CLI, RSA 2048, 1 day)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
        "-keyout", "ca.key", "-out", "ca.pem")  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        (d / f"{name}.ext").write_text(ext + "\n")
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr")  # fmt: skip
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext",
            "-out", f"{name}.pem")  # fmt: skip
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key")


#: (seq, op, key, value): one seq may carry several changes, as a batch does.
CHANGES: list[tuple[int, str, bytes, bytes | None]] = [
    (1, "set", b"w/a", b"1"),
    (2, "set", b"w/b", b"2"),
    (2, "set", b"w/c", b"3"),
    (2, "delete", b"w/a", None),
    (3, "set", b"x/other", b"0"),
    (4, "set", b"w/\xff", b"\xfe"),
]


@dataclass
class WatchApp:
    """The ASGI app. `drop_after`: on the first connection, fail after this many change
    lines (an abrupt close mid-stream; 0: right after a "from now" stream's first
    heartbeat). `oldest`: the lowest seq still retained."""

    drop_after: int | None = 3
    oldest: int = 1
    #: What `from_seq` each stream asked for (None: omitted, "from now").
    asked: list[int | None] = field(default_factory=list)
    heartbeats: int = 100
    #: The node's position for a stream without `from_seq`: it starts with a heartbeat
    #: of this seq, then sends the changes after it.
    now: int = 0

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        q = {
            k: v.encode("latin-1")
            for k, v in parse_qsl(scope["query_string"].decode("latin-1"), encoding="latin-1")
        }
        if scope["path"] != "/v1/watch":
            await _answer(send, 404, {"title": "Not Found", "status": 404, "detail": "no route"})
            return
        prefix = unquote_to_bytes(q.get("prefix", b""))
        raw = q.get("from_seq")
        first = not self.asked
        self.asked.append(None if raw is None else int(raw))
        from_seq = self.now + 1 if raw is None else int(raw)
        if 0 < from_seq < self.oldest:
            await _answer(
                send,
                410,
                {"title": "Gone", "status": 410, "detail": f"seq {from_seq} was collected"},
            )
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/x-ndjson")],
            }
        )
        if raw is None:
            await send(
                {
                    "type": "http.response.body",
                    "body": _line({"heartbeat": True, "seq": self.now}),
                    "more_body": True,
                }
            )
        sent = 0
        for seq, op, key, value in CHANGES:
            if seq < from_seq or not key.startswith(prefix):
                continue
            if first and self.drop_after is not None and sent == self.drop_after:
                raise ConnectionAbortedError("dropping the watch stream on purpose")
            doc: dict[str, Any] = {"seq": seq, "op": op}
            _put(doc, "key", key)
            if value is not None:
                _put(doc, "value", value)
            await send({"type": "http.response.body", "body": _line(doc), "more_body": True})
            sent += 1
        for _ in range(self.heartbeats):
            await asyncio.sleep(0.02)  # deliberate: a live stream's heartbeats come apart
            await send(
                {
                    "type": "http.response.body",
                    "body": _line({"heartbeat": True, "seq": CHANGES[-1][0]}),
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b""})


def _put(doc: dict[str, Any], name: str, raw: bytes) -> None:
    try:
        doc[name] = raw.decode()
    except UnicodeDecodeError:
        doc[name + "_b64"] = base64.b64encode(raw).decode()


def _line(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode() + b"\n"


async def _answer(send: Any, status: int, doc: dict[str, Any]) -> None:
    body = json.dumps(doc).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/problem+json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Served:
    """ASGI `app` served over mutual TLS on 127.0.0.1 in a thread; `stop()` ends it."""

    def __init__(self, app: Any, pki: Pki) -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = int(sock.getsockname()[1])
        self.url = f"https://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            log_level="critical",
            ssl_certfile=str(pki.server_cert),
            ssl_keyfile=str(pki.server_key),
            ssl_ca_certs=str(pki.ca),
            ssl_cert_reqs=ssl.CERT_REQUIRED,
            timeout_graceful_shutdown=1,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        wait_until(lambda: self.server.started, 10, "the watch server started")

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(10)
