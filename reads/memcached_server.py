"""The memcached text protocol listener (`--memcached-listen`) over the store.

`MemcachedHandler.step` answers the complete commands in a connection's buffer (one short
read transaction per `get`); `memcached_service()` wraps it in a `TcpService`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from core.errors import CRCError, ReadProtocolError
from reads import fastget, readstats
from reads import memcached_protocol as mc
from reads.metrics import READ_ERRORS, READ_SECONDS
from reads.tcp import ListenerLimits, Run, TcpService, drain
from store.format import MAX_KEY
from store.store import Store

VERSION = "1.6.0-mercury"
_OBSERVE_GET = fastget.SourcedObserve(READ_SECONDS, "memcached_get")
#: Bytes of values one `get` may answer; beyond it the command fails.
MAX_REPLY_BYTES = 256 << 20


class MemcachedHandler:
    """Answers memcached commands from `store`; keeps memcached-style counters."""

    def __init__(
        self,
        store: Store,
        connections: Callable[[], int] = lambda: 0,
        *,
        flags_in_value: bool = False,
    ) -> None:
        self.store = store
        #: `--memcached-flags`: flags are the value's last 4 bytes (KT's `opts=f`).
        self.flags_in_value = flags_in_value
        self.connections = connections
        self.started = time.time()
        self.cmd_get = 0
        self.get_hits = 0
        self.get_misses = 0
        #: The shortcut `reads.tcp` calls with a connection's received bytes: a lone
        #: one-key `get` answered whole (compiled when built), the rest to `_fast_more`.
        self.fast = fastget.MC_GET(
            store.env,
            store.dbs.data,
            flags_in_value,
            self._fast_more,
            _OBSERVE_GET,
            readstats.note_read,
            MAX_KEY,
            mc.MAX_LINE,
        )

    def step(self, buf: bytearray) -> tuple[bytes, bool]:
        """Answer every complete command in `buf` at once (tests and tools)."""
        return drain(self.run(buf))

    def run(self, buf: bytearray) -> Run:
        """Answer the complete commands at the front of `buf`, one per step, deleting them
        (see `reads.tcp.Session`; a command line is at most 64 KiB, so one step is small)."""
        while buf:
            try:
                got = mc.parse_command(buf)
            except ReadProtocolError as err:
                READ_ERRORS.labels("memcached", "protocol").inc()
                buf.clear()
                yield mc.client_error(err.message)
                return True
            if got is None:
                return False
            cmd, n = got
            del buf[:n]
            if cmd.reply is not None:
                READ_ERRORS.labels("memcached", "protocol").inc()
                yield cmd.reply
            elif cmd.name in (b"get", b"gets"):
                yield self._get(cmd.keys, cmd.name == b"gets")
            elif cmd.name == b"quit":
                return True
            elif cmd.name == b"version":
                yield b"VERSION " + VERSION.encode() + b"\r\n"
            elif cmd.name == b"stats":
                yield self._stats()
            elif cmd.name == b"verbosity":
                yield b"OK\r\n"
            else:
                yield from self.write(cmd)
        return False

    def write(self, cmd: mc.Command) -> Run:
        """A write command: refused on this read-only node (the root's write listener,
        reads/memcached_writes.py, overrides this)."""
        if not cmd.noreply:
            yield mc.READ_ONLY
        return False

    def _fast_more(self, data: bytes) -> bytes | None:
        """What `fast` (`fastget.McGet`) hands back: the reply to `data` when it is one
        `get`/`gets` line of several keys, or of one key whose record is chunked or fails
        its CRC (`_get` reassembles it or reports the failure); None for anything else,
        which `run` then parses in full (`reads.tcp.Fast`)."""
        got = mc.get_line(data)
        if got is None:
            return None
        keys, with_cas = got
        if not keys or (len(data) > MAX_KEY and any(len(k) > MAX_KEY for k in keys)):
            return None  # run's parser answers ERROR / CLIENT_ERROR
        return self._get(keys, with_cas)

    @staticmethod
    def phase(buf: bytearray) -> str:
        """ "header" until the command line is complete, then "body" (a storage command's
        data block; see `reads.tcp.Session`)."""
        return "body" if b"\n" in buf else "header"

    def _get(self, keys: list[bytes], with_cas: bool) -> bytes:
        t0 = time.perf_counter()
        hits: list[tuple[bytes, bytes, int]] = []
        size = 0
        try:
            with self.store.reader() as r:
                for k in keys:
                    v = r.get(k)
                    if v is not None:
                        readstats.note_read(k)
                        hits.append((k, v.value, v.seq))
                        size += len(v.value)
                        if size > MAX_REPLY_BYTES:
                            READ_ERRORS.labels("memcached_get", "too_large").inc()
                            return b"SERVER_ERROR reply too large; ask for fewer keys\r\n"
        except CRCError as err:
            READ_ERRORS.labels("memcached_get", "crc").inc()
            return b"SERVER_ERROR " + err.message.encode("ascii", "replace") + b"\r\n"
        self.cmd_get += len(keys)
        self.get_hits += len(hits)
        self.get_misses += len(keys) - len(hits)
        reply = mc.encode_values(hits, with_cas, self.flags_in_value)
        _OBSERVE_GET(time.perf_counter() - t0)
        return reply

    def _stats(self) -> bytes:
        now = time.time()
        st = self.store.stat()
        return mc.encode_stats(
            [
                ("pid", os.getpid()),
                ("uptime", int(now - self.started)),
                ("time", int(now)),
                ("version", VERSION),
                ("curr_connections", self.connections()),
                ("curr_items", st["entries_data"]),
                ("cmd_get", self.cmd_get + self.fast.cmd_get),
                ("get_hits", self.get_hits + self.fast.get_hits),
                ("get_misses", self.get_misses + self.fast.get_misses),
            ]
        )


#: What memcached itself answers a connection over its limit.
BUSY = b"SERVER_ERROR Too many open connections\r\n"


def memcached_service(
    store: Store,
    host: str,
    port: int,
    *,
    limits: ListenerLimits | None = None,
    flags_in_value: bool = False,
) -> TcpService:
    """The memcached listener as a `Service` (one handler shared by all connections: the
    protocol keeps no per-connection state beyond the buffer)."""
    holder: list[TcpService] = []
    handler = MemcachedHandler(
        store, connections=lambda: holder[0].connections, flags_in_value=flags_in_value
    )
    svc = TcpService("memcached", host, port, lambda: handler, limits=limits, busy_reply=BUSY)
    holder.append(svc)
    return svc
