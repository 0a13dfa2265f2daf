"""The HTTP face of a candidate that does not lead: status, and writers sent to the leader.

While a candidate is a standby (or an election runs) its gateway address answers
`GET /v1/status` and `GET /healthz` with its role, term and the leader's URL, `GET /metrics`
with this node's own metrics (a redirect would have a scraper record the leader's figures
as this node's: a standby behind would look caught up), and every other request with
**307** to the same path on the leader's URL (a 307 keeps the method and body: a PUT is
replayed as a PUT), or **503** problem+json with ``leader_url: null`` while no leader is
known. A tiny bounded HTTP/1.1 server: one request per connection, request head at most
`MAX_HEAD` bytes within `HEAD_TIMEOUT_S`, bodies never read. When the candidate wins, this
listener closes and the root's gateway takes the address.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Callable
from typing import Any

from core.problems import problem_document

log = logging.getLogger("mercury.ha.front")

MAX_HEAD = 16 << 10
HEAD_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 256
#: Bodies up to this size are read and dropped before answering (see `_handle`).
MAX_DRAINED_BODY = 1 << 20
#: After answering, what is left of a larger body (a value may be 25 MiB) is read and
#: dropped, up to this much and `LINGER_S`, before closing: closing a socket with unread
#: bytes sends a reset, which can destroy the answer before the client has read it.
MAX_LINGER_BYTES = 32 << 20
LINGER_S = 5.0

#: -> (role, term, leader_url or None, extra status fields)
StatusFn = Callable[[], tuple[str, int | None, str | None, dict[str, Any]]]
#: -> (content type, body) of the Prometheus exposition
MetricsFn = Callable[[], tuple[str, bytes]]


class Front:
    """Serves the non-leader face on `host:port`."""

    def __init__(
        self,
        host: str,
        port: int,
        status: StatusFn,
        ssl_context: ssl.SSLContext | None = None,
        metrics: MetricsFn | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.status = status
        #: this node's metrics (None: `/metrics` is redirected like any other path)
        self.metrics = metrics
        #: HTTPS like the leader's gateway on the same address (None: plain HTTP)
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen (retrying briefly: the root process that held the port may be exiting)."""
        for attempt in range(50):
            try:
                self._server = await asyncio.start_server(
                    self._handle,
                    self.host,
                    self.port,
                    reuse_address=True,
                    ssl=self.ssl_context,
                    ssl_handshake_timeout=HEAD_TIMEOUT_S if self.ssl_context else None,
                )
                return
            except OSError:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        """Stop listening and drop open connections (the port is free when this returns)."""
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        try:
            if len(self._conns) > MAX_CONNECTIONS:
                # Answered and closed at once: lingering here would let a flood hold
                # sockets past the cap (no request was read, so there is little to reset).
                await self._refuse(
                    writer, reader, 503, "too many connections", retry=True, linger=False
                )
                return
            try:
                async with asyncio.timeout(HEAD_TIMEOUT_S):
                    head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.LimitOverrunError, ValueError):
                head = b"x" * (MAX_HEAD + 1)  # past the stream's own limit: too large too
            if len(head) > MAX_HEAD:
                await self._refuse(writer, reader, 431, f"request head over {MAX_HEAD} bytes")
                return
            line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = line.split(" ")
            # Origin-form targets only: "@evil.example/x" after the leader's URL would
            # name another host in the Location (an open redirect).
            if len(parts) != 3 or not parts[1].startswith("/"):
                await self._refuse(writer, reader, 400, "malformed request line")
                return
            method, target = parts[0], parts[1]
            # Read (and drop) a small body first: closing with unread bytes sends a reset
            # that can reach the client before our answer does.
            length = _content_length(head)
            drained = 0 < length <= MAX_DRAINED_BODY
            if drained:
                async with asyncio.timeout(HEAD_TIMEOUT_S):
                    await reader.readexactly(length)
            writer.write(self.answer(method, target))
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                await writer.drain()
            if length != 0 and not drained:  # a large or chunked body: linger, then close
                await _linger(reader, writer)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            if task is not None:
                self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _refuse(
        self,
        writer: asyncio.StreamWriter,
        reader: asyncio.StreamReader,
        status: int,
        detail: str,
        *,
        retry: bool = False,
        linger: bool = True,
    ) -> None:
        """Answer a request this front will not serve with a problem+json and close (after
        lingering: the request's unread bytes must not reset the answer away)."""
        reason = {400: "Bad Request", 431: "Request Header Fields Too Large"}.get(
            status, "Service Unavailable"
        )
        doc = problem_document(status, detail)
        headers = [("Retry-After", "1")] if retry else []
        writer.write(
            _response(status, reason, "application/problem+json", json.dumps(doc).encode(), headers)
        )
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            await writer.drain()
        if linger:
            await _linger(reader, writer)

    def answer(self, method: str, target: str) -> bytes:
        """The whole HTTP response to `method target`."""
        role, term, leader_url, extra = self.status()
        path = target.split("?", 1)[0]
        if method == "GET" and path in ("/v1/status", "/healthz"):
            body = {"role": role, "term": term, "leader_url": leader_url, **extra}
            if path == "/healthz":
                # Every node's health shape (`{"status", "role", "seq"}`): this process is
                # alive and answering; `role` says it takes no writes.
                body = {"status": "ok", **body}
            return _response(200, "OK", "application/json", json.dumps(body).encode())
        if method == "GET" and path == "/metrics" and self.metrics is not None:
            ctype, text = self.metrics()
            return _response(200, "OK", ctype, text)
        if leader_url is None:
            doc = problem_document(
                503,
                "no leader: an election is running; retry shortly",
                slug="no-leader",
                role=role,
            )
            doc["leader_url"] = None  # said explicitly: clients look for it
            return _response(
                503,
                "Service Unavailable",
                "application/problem+json",
                json.dumps(doc).encode(),
                [("Retry-After", "1")],
            )
        location = leader_url.rstrip("/") + target
        doc = problem_document(
            307, f"this node is a {role}; the leader is {leader_url}", leader_url=leader_url
        )
        return _response(
            307,
            "Temporary Redirect",
            "application/problem+json",
            json.dumps(doc).encode(),
            [("Location", location)],
        )


def _response(
    status: int,
    reason: str,
    ctype: str,
    body: bytes,
    headers: list[tuple[str, str]] | None = None,
) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", f"Content-Type: {ctype}"]
    lines += [f"{k}: {v}" for k, v in headers or []]
    lines += [f"Content-Length: {len(body)}", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Read and drop what the client still sends, up to `MAX_LINGER_BYTES` and `LINGER_S`
    (or its EOF), so that closing does not reset the answer just written. Our side is shut
    first: a client reading to the end (``Connection: close``) then closes at once."""
    left = MAX_LINGER_BYTES
    with contextlib.suppress(TimeoutError, OSError, RuntimeError):
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            while left > 0:
                data = await reader.read(min(left, 1 << 16))
                if not data:
                    return
                left -= len(data)


def _content_length(head: bytes) -> int:
    """The body's declared length: 0 without one, -1 when unknown (chunked) or malformed."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"transfer-encoding":
            return -1
        if name.strip().lower() == b"content-length":
            try:
                return int(value.strip())
            except ValueError:
                return -1
    return 0
