"""The HTTP face of a candidate that does not lead: status, and writers sent to the leader.

While a candidate is a standby (or an election runs) its gateway address answers
`GET /v1/status` and `GET /healthz` with its role, term and the leader's URL, `GET /metrics`
with this node's own metrics (a redirect would have a scraper record the leader's figures
as this node's: a standby behind would look caught up), and every other request with
**307** to the same path on the leader's URL (a 307 keeps the method and body: a PUT is
replayed as a PUT), or **503** problem+json with ``leader_url: null`` while no leader is
known. A tiny bounded HTTP/1.1 server: one request per connection, request head at most
`MAX_HEAD` bytes within `HEAD_TIMEOUT_S`. When the candidate wins, this listener closes and
the root's gateway takes the address.

"Known" means confirmed (`ha.role.may_route`): the candidate names a leader only while its
lease is renewing on etcd and the standby's link to it holds. A dead leader's key outlives
it by up to the lease TTL; a 307 there would meet a refused connection, so until the next
leader is known the answer is the election's 503 + Retry-After.

With a `Forwarder` (`--ha-forward`) a write (any method but GET and HEAD, whose answers
may be endless streams) is not redirected but passed to the leader, and the leader's
answer returned as it is: producers can be given any candidate's address, and a client
that does not follow redirects with its token still writes. A forwarded request carries
`FORWARDED_HEADER`; a front never forwards (nor redirects) a request that has it, so a
leader that changed between two looks costs a 503, never a loop. Bodies up to
`MAX_FORWARD_BODY` (and `MAX_FORWARD_INFLIGHT` over all connections) are forwarded; a larger
or chunked one gets the 307 (the leader is confirmed either way). The leader unreachable:
503 + Retry-After (nothing reached it); the link failing after the request was sent: 502
or 504, which the SDK retries only with an Idempotency-Key (the write may have applied).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

import httpx

from core.problems import problem_document
from net.budget import Budget, Reason, peer_principal

log = logging.getLogger("mercury.ha.front")

MAX_HEAD = 16 << 10
HEAD_TIMEOUT_S = 5.0
#: Connections at once. At the cap a newcomer takes the slot of the one that has held its
#: slot longest without an answer (its head, or its body, still arriving: `_Conn`), the
#: ones of an address over its share (`PRINCIPAL_SHARE`) first; it is answered 503 only
#: when every slot is being answered.
MAX_CONNECTIONS = 256
PRINCIPAL_SHARE = 0.25
#: Bodies up to this size are read and dropped before answering (see `_handle`).
MAX_DRAINED_BODY = 1 << 20
#: After answering, what is left of a larger body (a value may be 25 MiB) is read and
#: dropped, up to this much and `LINGER_S`, before closing: closing a socket with unread
#: bytes sends a reset, which can destroy the answer before the client has read it.
MAX_LINGER_BYTES = 32 << 20
LINGER_S = 5.0

#: Marks a request a standby passed to its leader (the value: that standby's node name).
FORWARDED_HEADER = "Mercury-Forwarded-By"
#: The largest body a standby forwards (a larger one gets the 307), and the most body
#: bytes held for forwarding over all its connections at once.
MAX_FORWARD_BODY = 16 << 20
MAX_FORWARD_INFLIGHT = 64 << 20
#: How long a forwarded write may take on the leader (a batch window, the standbys'
#: confirmation, a large batch's commit).
FORWARD_TIMEOUT_S = 30.0
FORWARD_CONNECT_TIMEOUT_S = 1.0
#: Headers that describe one connection, not the request (RFC 9110 7.6.1), and those the
#: forwarding client sets itself.
_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "expect",
    }
)

#: -> (role, term, leader_url or None, extra status fields)
StatusFn = Callable[[], tuple[str, int | None, str | None, dict[str, Any]]]
#: -> (content type, body) of the Prometheus exposition
MetricsFn = Callable[[], tuple[str, bytes]]


class Forwarder:
    """Passes a write to the leader and gives back its answer (`--ha-forward`)."""

    def __init__(self, node: str, ssl_context: ssl.SSLContext | None = None) -> None:
        self.node = node
        self._http = httpx.AsyncClient(
            verify=ssl_context if ssl_context is not None else True,
            timeout=httpx.Timeout(FORWARD_TIMEOUT_S, connect=FORWARD_CONNECT_TIMEOUT_S),
            follow_redirects=False,
        )
        self.inflight = 0

    async def close(self) -> None:
        await self._http.aclose()

    async def forward(
        self, leader_url: str, method: str, target: str, head: bytes, body: bytes
    ) -> bytes:
        """The whole HTTP response to send back for `method target` passed to the leader."""
        headers = [(k, v) for k, v in _header_list(head) if k.lower() not in _HOP] + [
            (FORWARDED_HEADER, self.node)
        ]
        url = leader_url.rstrip("/") + target
        try:
            r = await self._http.request(method, url, headers=headers, content=body)
        except httpx.ConnectError as err:  # nothing reached the leader
            return _problem(503, f"the leader {leader_url} is unreachable ({err}); retry shortly")
        except httpx.TimeoutException:
            return _problem(
                504,
                f"the leader {leader_url} did not answer in {FORWARD_TIMEOUT_S:.0f}s; the write "
                "may have been applied: retry with the same Idempotency-Key",
                retry=False,
            )
        except httpx.HTTPError as err:
            return _problem(
                502,
                f"the link to the leader {leader_url} failed ({err}); the write may have been "
                "applied: retry with the same Idempotency-Key",
                retry=False,
            )
        # httpx decoded any content coding: the body goes back as it now is.
        out = [
            (k, v)
            for k, v in r.headers.multi_items()
            if k.lower() not in _HOP and k.lower() not in ("content-encoding", "content-type")
        ]
        ctype = r.headers.get("content-type", "application/octet-stream")
        return _response(r.status_code, r.reason_phrase, ctype, r.content, out)


def _count(reason: Reason) -> None:
    # Debug only: a flood at the cap must not flood the log (its newcomers are answered 503).
    log.debug("front: %s at the cap of %d connections", reason.value, MAX_CONNECTIONS)


class _Conn:
    """A connection of the front as its budget sees it (`net.budget.Member`): from its
    accept until its head is whole it waits for a request (idle), then while its body
    arrives it has made no progress (nothing it sent was acted on): either may be evicted
    at the cap, the longest waiting first. Once its request is being answered, never.
    Sockets that connect and send nothing (or a head a byte at a time), reopened as they
    are closed, held every slot for the head timeout each and every newcomer was 503."""

    __slots__ = ("body_since", "head_since", "task", "writer")

    def __init__(self, task: asyncio.Task[None], writer: asyncio.StreamWriter) -> None:
        self.task = task
        self.writer = writer
        self.head_since: float | None = time.monotonic()
        self.body_since: float | None = None

    def idle_since(self) -> float | None:
        return self.head_since

    def stalled_since(self) -> float | None:
        return self.body_since

    def gone(self) -> bool:
        return self.writer.transport.is_closing()

    def evict(self) -> None:
        self.writer.transport.abort()
        self.task.cancel()


class Front:
    """Serves the non-leader face on `host:port`."""

    def __init__(
        self,
        host: str,
        port: int,
        status: StatusFn,
        ssl_context: ssl.SSLContext | None = None,
        metrics: MetricsFn | None = None,
        forward: Forwarder | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        self.host = host
        #: The listening socket, held for the candidate's whole life (passed in by a
        #: hand-over, else bound by the first `start`): the front serves on a copy of it,
        #: and a leading root process accepts on another (`listening_socket`), so the port
        #: never closes while the candidate turns leader or back (a client connecting in
        #: between waits in the one accept queue instead of being refused).
        self.sock = sock
        #: passes writes to the leader (None: they get the 307)
        self.forward = forward
        self.port = port
        self.status = status
        #: this node's metrics (None: `/metrics` is redirected like any other path)
        self.metrics = metrics
        #: HTTPS like the leader's gateway on the same address (None: plain HTTP)
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        #: The same connections, held to `MAX_CONNECTIONS` (`_Conn`).
        self._budget: Budget[_Conn] = Budget(
            MAX_CONNECTIONS, _count, stalled_body=0.0, share=PRINCIPAL_SHARE
        )

    async def start(self) -> None:
        """Listen (binding the socket first, retrying briefly: a root process of an older
        candidate that held the port may be exiting)."""
        if self.sock is None:
            self.sock = await self._bind()
        self._server = await asyncio.start_server(
            self._handle,
            sock=_copy(self.sock),  # asyncio closes what it serves on: never the one held
            ssl=self.ssl_context,
            ssl_handshake_timeout=HEAD_TIMEOUT_S if self.ssl_context else None,
        )

    async def _bind(self) -> socket.socket:
        for attempt in range(50):
            try:
                sock = socket.create_server((self.host, self.port), backlog=2048)
                sock.setblocking(False)
                return sock
            except OSError:
                if attempt == 49:
                    raise
                await asyncio.sleep(0.1)
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        """Stop accepting and drop open connections (the port stays open: the socket is
        held until `close`; a leading root accepts on its copy)."""
        if self._server is not None:
            self._server.close()
            for t in list(self._conns):
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    def listening_socket(self) -> socket.socket | None:
        """A copy of the listening socket (for a hand-over or a leading root; the caller
        closes it), or None when none was bound yet."""
        return _copy(self.sock) if self.sock is not None else None

    async def drain(self, timeout: float) -> None:
        """Stop accepting (this process's copy of the socket: a successor holding the same
        one keeps the port open), let the requests in flight finish for up to `timeout`
        seconds (a forwarded write waits for the leader's answer), then drop the rest."""
        if self._server is None:
            return
        self._server.close()
        conns = list(self._conns)
        if conns:
            await asyncio.wait(conns, timeout=timeout)
        await self.stop()

    async def close(self) -> None:
        """Release the listening socket and the forwarding client (after `stop`)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.forward is not None:
            await self.forward.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        conn: _Conn | None = None
        if task is not None:
            self._conns.add(task)
        try:
            conn = _Conn(task, writer) if task is not None else None
            if conn is None or not self._budget.admit(
                conn, peer_principal(writer.get_extra_info("peername"))
            ):
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
            conn.head_since = None
            conn.body_since = time.monotonic()  # its body (if any) arriving: no progress
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
            length = _content_length(head)
            leader = self._forward_to(method, head, length)
            if leader is not None:
                await self._forward(reader, writer, conn, leader, method, target, head, length)
                return
            # Read (and drop) a small body first: closing with unread bytes sends a reset
            # that can reach the client before our answer does.
            drained = 0 < length <= MAX_DRAINED_BODY
            if drained:
                async with asyncio.timeout(HEAD_TIMEOUT_S):
                    await reader.readexactly(length)
            conn.body_since = None  # answered now: never evicted while its answer goes out
            writer.write(self.answer(method, target, forwarded=_has_header(head, FORWARDED_HEADER)))
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                await writer.drain()
            if length != 0 and not drained:  # a large or chunked body: linger, then close
                conn.head_since = time.monotonic()  # answered: evictable while it lingers
                await _linger(reader, writer)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        except asyncio.CancelledError:
            if conn is None or self._budget.principal_of(conn) is not None:
                raise  # not an eviction (the front is stopping)
        finally:
            if conn is not None:
                self._budget.leave(conn)
            if task is not None:
                self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _forward_to(self, method: str, head: bytes, length: int) -> str | None:
        """The confirmed leader's URL when this request is to be forwarded there, else None
        (it gets `answer`: a read, a request already forwarded once, no forwarding, no
        confirmed leader, or a body too large or of unknown length to hold)."""
        fw = self.forward
        if fw is None or method in ("GET", "HEAD") or _has_header(head, FORWARDED_HEADER):
            return None
        if length < 0 or length > MAX_FORWARD_BODY or fw.inflight + length > MAX_FORWARD_INFLIGHT:
            return None
        return self.status()[2]

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        conn: _Conn,
        leader: str,
        method: str,
        target: str,
        head: bytes,
        length: int,
    ) -> None:
        fw = self.forward
        assert fw is not None
        fw.inflight += length
        try:
            if length and _header(head, "expect").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # or curl waits a second
            async with asyncio.timeout(FORWARD_TIMEOUT_S):
                body = await reader.readexactly(length) if length else b""
            # Passed to the leader: never evicted now (the write may apply there).
            conn.body_since = None
            answer = await fw.forward(leader, method, target, head, body)
        finally:
            fw.inflight -= length
        writer.write(answer)
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            await writer.drain()

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

    def answer(self, method: str, target: str, *, forwarded: bool = False) -> bytes:
        """The whole HTTP response to `method target` (`forwarded`: another standby passed
        it here believing this node leads)."""
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
        if leader_url is None or forwarded:
            if forwarded:
                detail = "forwarded to a node that does not lead (leadership moved); retry shortly"
            elif extra.get("unconfirmed_leader"):
                detail = (
                    f"the leader {extra['unconfirmed_leader']} cannot be confirmed (its lease "
                    "is not being renewed, or this node lost its link to it): an election "
                    "is likely; retry shortly"
                )
            else:
                detail = "no leader: an election is running; retry shortly"
            doc = problem_document(503, detail, slug="no-leader", role=role)
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


def _problem(status: int, detail: str, *, retry: bool = True) -> bytes:
    """A problem+json answer of the forwarding path (Retry-After on a 503)."""
    reason = {502: "Bad Gateway", 504: "Gateway Timeout"}.get(status, "Service Unavailable")
    doc = problem_document(status, detail)
    headers = [("Retry-After", "1")] if retry else []
    return _response(status, reason, "application/problem+json", json.dumps(doc).encode(), headers)


def _header_list(head: bytes) -> list[tuple[str, str]]:
    """The header fields of a request head, in order."""
    out = []
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip():
            out.append((name.strip().decode("latin-1"), value.strip().decode("latin-1")))
    return out


def _has_header(head: bytes, name: str) -> bool:
    lname = name.lower()
    return any(k.lower() == lname for k, _ in _header_list(head))


def _header(head: bytes, name: str) -> str:
    """The first value of header `name` ("" when absent)."""
    lname = name.lower()
    return next((v for k, v in _header_list(head) if k.lower() == lname), "")


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


def _copy(sock: socket.socket) -> socket.socket:
    """Another descriptor of the same listening socket (one accept queue)."""
    out = socket.socket(fileno=os.dup(sock.fileno()))
    out.setblocking(False)
    return out
