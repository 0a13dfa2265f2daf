"""A stand-in `ktserver` for client libraries' own test suites (conformance runs).

ukt's suite starts its server as ``$KT_BINARY -le -host H -port P [options] DB...`` and
connects to H:P. This shim accepts that command line and serves H:P as one KT server made
of two Mercury nodes, as producers and readers would use them: every write request goes
to the root's KT listener (``$MERCURY_KT``, run with ``--kt-producer``), every other
request to a replica's KT listener (``$MERCURY_READ_KT``). A client's suite expects to
read its own writes at once, so a read that follows a write (on any connection) first
waits until the replica has applied the root's seq (``$MERCURY_ROOT_HTTP``,
``$MERCURY_READ_HTTP``: their ``/v1/status``). A write sent without a reply (binary
``BONOREPLY``) is followed on the same root connection by an empty binary ``get_bulk``,
whose answer comes only after that write's commit (the listener answers a connection's
requests in order).

Requests are parsed with Mercury's own KT parser (`kt/protocol.py`) and forwarded
byte for byte; replies are forwarded byte for byte too. A request the parser refuses
(over 16 MiB, malformed) closes the client's connection, as the listener itself would.
Loopback only; each connection is bounded by an idle timeout and each wait for the
replica by a deadline. Ends on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# The suite gives its server two seconds to listen: the port is bound first, and these
# (slow on a loaded machine) are imported once it listens.
if TYPE_CHECKING:
    import httpx

    from kt import protocol as kt

IDLE_S = 120.0
#: Longest wait for the replica to apply a write (then the reply goes out anyway).
CATCH_UP_S = 20.0
#: An empty binary get_bulk (magic 0xBA, flags, no records): its answer means every
#: earlier request on the connection was done (used after a write sent without a reply).
PROBE = bytes([0xBA]) + struct.pack(">II", 0, 0)
_U32 = struct.Struct(">I")
_GET_BULK_REC = struct.Struct(">HIIq")


def _addr(var: str) -> tuple[str, int]:
    host, port = os.environ[var].rsplit(":", 1)
    return host, int(port)


class Upstream:
    """One connection to a node's KT listener, opened when first needed."""

    def __init__(self, addr: tuple[str, int]) -> None:
        self.addr = addr
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def exchange(self, raw: bytes, req: kt.BinaryRequest | kt.HttpRequest) -> bytes:
        """Send one request; its whole reply (b"" for a binary request without one)."""
        if self.w is None or self.w.is_closing():
            self.r, self.w = await asyncio.open_connection(*self.addr)
        assert self.r is not None and self.w is not None
        self.w.write(raw)
        await self.w.drain()
        if isinstance(req, kt.BinaryRequest):
            return b"" if req.no_reply else await self._binary_reply(self.r)
        return await self._http_reply(self.r, req.method == "HEAD")

    async def _binary_reply(self, r: asyncio.StreamReader) -> bytes:
        out = bytearray(await r.readexactly(1))
        magic = out[0]
        if magic in (kt.MAGIC_SET_BULK, kt.MAGIC_REMOVE_BULK):
            out += await r.readexactly(4)
        elif magic in (kt.MAGIC_GET_BULK, kt.MAGIC_PLAY_SCRIPT):
            head = await r.readexactly(4)
            out += head
            for _ in range(_U32.unpack(head)[0]):
                if magic == kt.MAGIC_GET_BULK:
                    rec = await r.readexactly(_GET_BULK_REC.size)
                    _, ksiz, vsiz, _ = _GET_BULK_REC.unpack(rec)
                else:
                    rec = await r.readexactly(8)
                    ksiz, vsiz = struct.unpack(">II", rec)
                out += rec + await r.readexactly(ksiz + vsiz)
        return bytes(out)

    async def _http_reply(self, r: asyncio.StreamReader, head_only: bool) -> bytes:
        head = await r.readuntil(b"\r\n\r\n")
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if not head_only:
            if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
                body = await self._chunked(r)
            elif b"content-length" in headers:
                body = await r.readexactly(int(headers[b"content-length"]))
            else:
                body = await r.read()  # delimited by the close
        if b"close" in headers.get(b"connection", b"").lower() and self.w is not None:
            self.w.close()
            self.w = None
        return head + body

    @staticmethod
    async def _chunked(r: asyncio.StreamReader) -> bytes:
        out = bytearray()
        while True:
            line = await r.readuntil(b"\r\n")
            out += line
            size = int(line.split(b";")[0], 16)
            out += await r.readexactly(size + 2)
            if size == 0:
                return bytes(out)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()


def parse(buf: bytearray) -> tuple[kt.BinaryRequest | kt.HttpRequest, int] | None:
    """One complete request at the front of `buf` (None: not yet)."""
    if not buf:
        return None
    if kt.is_binary(buf[0]):
        return kt.parse_binary(buf)
    return kt.parse_http(buf)


def is_write(req: kt.BinaryRequest | kt.HttpRequest) -> bool:
    """Whether the request goes to the root: KT's writes, and scripts (which may write)."""
    from kt.server import WRITE_PROCEDURES

    if isinstance(req, kt.BinaryRequest):
        return req.magic in (kt.MAGIC_SET_BULK, kt.MAGIC_REMOVE_BULK, kt.MAGIC_PLAY_SCRIPT)
    if req.method in ("PUT", "DELETE"):
        return True
    proc = kt.url_decode(req.path[5:])
    return req.path.startswith(b"/rpc/") and (proc in WRITE_PROCEDURES or proc == b"play_script")


def load() -> None:
    """Import what serving needs (after the port is bound)."""
    global kt, httpx
    import httpx

    from kt import protocol as kt


class Shim:
    def __init__(self) -> None:
        self.root_kt = _addr("MERCURY_KT")
        self.read_kt = _addr("MERCURY_READ_KT")
        self.http = httpx.AsyncClient(timeout=5.0)
        self.root_status = os.environ["MERCURY_ROOT_HTTP"] + "/v1/status"
        self.read_status = os.environ["MERCURY_READ_HTTP"] + "/v1/status"

        #: Writes answered, and how many of them the replica is known to have applied: a
        #: read waits for the replica only when a write was answered since (a run of
        #: writes then costs one wait, before the read that follows it).
        self.writes_done = 0
        self.writes_seen = 0
        #: The replica's applied seq, polled by one task while any read waits for it.
        self.applied = 0
        self.changed = asyncio.Event()
        self.waiting = 0
        self.poller: asyncio.Task[None] | None = None

    async def caught_up(self) -> None:
        """Wait until the replica applied what the root has committed (bounded: then the
        read goes ahead and the suite sees what it sees)."""
        want = (await self.http.get(self.root_status)).json()["seq"]
        if self.applied >= want:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        self.waiting += 1
        if self.poller is None or self.poller.done():
            self.poller = asyncio.create_task(self._poll())
        try:
            while self.applied < want and loop.time() < deadline:
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), deadline - loop.time())
        finally:
            self.waiting -= 1

    async def _poll(self) -> None:
        """One status poll of the replica at a time, for every waiting write."""
        while self.waiting:
            self.applied = (await self.http.get(self.read_status)).json()["seq"]
            self.changed.set()
            # The replica tells its seq only when asked: this is the poll's pace (the
            # waiting writes wake on `changed`, never on this sleep).
            await asyncio.sleep(0.002)

    async def handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        root, read = Upstream(self.root_kt), Upstream(self.read_kt)
        buf = bytearray()
        try:
            while True:
                got = parse(buf)
                while got is None:
                    data = await asyncio.wait_for(cr.read(1 << 16), IDLE_S)
                    if not data:
                        return
                    buf += data
                    got = parse(buf)
                req, n = got
                raw = bytes(buf[:n])
                del buf[:n]
                if is_write(req):
                    reply = await root.exchange(raw, req)
                    if isinstance(req, kt.BinaryRequest) and req.no_reply:
                        probe, _ = kt.parse_binary(PROBE) or (None, 0)
                        assert probe is not None
                        await root.exchange(PROBE, probe)
                    self.writes_done += 1
                else:
                    # any write answered so far (on any connection) is visible here
                    done = self.writes_done
                    if done > self.writes_seen:
                        await self.caught_up()
                        self.writes_seen = max(self.writes_seen, done)
                    reply = await read.exchange(raw, req)
                if reply:
                    cw.write(reply)
                    await cw.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client or a node went away, or the shim is stopping
        except Exception as err:  # the parser's refusal: close, as the listener does
            if type(err).__name__ != "ReadProtocolError":
                raise
        finally:
            root.close()
            read.close()
            with contextlib.suppress(OSError):
                cw.close()


async def main(argv: list[str]) -> None:
    host = argv[argv.index("-host") + 1] if "-host" in argv else "127.0.0.1"
    port = int(argv[argv.index("-port") + 1])
    holder: list[Shim] = []

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await holder[0].handle(r, w)

    server = await asyncio.start_server(handle, host, port)
    load()
    shim = Shim()
    holder.append(shim)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
    await shim.http.aclose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
