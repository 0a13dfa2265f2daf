"""The memcached text protocol listener (`--memcached-listen`) over the store.

`MemcachedHandler.run` answers the complete commands in a connection's buffer in slices
(`net.tcp`'s run generator): a `get` of many keys reads `BULK_SLICE` keys per read
transaction and yields the loop between slices, as KT's get_bulk does, so one client's
huge multi-get never holds the others; a big reply is made a piece at a time as the client
takes it (`reads.replystream`). `memcached_service()` wraps it in a `TcpService`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator

from core.errors import ReadProtocolError
from memcached import protocol as mc
from net.tcp import ListenerLimits, Run, TcpService, drain
from reads import fastget, keyspaces, readstats, replystream
from reads.metrics import READ_ERRORS, READ_SECONDS
from reads.replystream import BULK_SLICE
from store.format import MAX_KEY
from store.reader import Reader
from store.store import Store

VERSION = "1.6.0-mercury"
_OBSERVE_GET = fastget.SourcedObserve(READ_SECONDS, "memcached_get")
#: Bytes of values one `get` may answer; beyond it the command fails.
MAX_REPLY_BYTES = 256 << 20

Hit = tuple[bytes, bytes, int]  # key, value, seq


def _fetch(r: Reader, key: bytes) -> Hit | None:
    v = r.get(key)
    return None if v is None else (key, v.value, v.seq)


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
        #: The shortcut `net.tcp` calls with a connection's received bytes: a lone
        #: one-key `get` answered whole (compiled when built), the rest to `_fast_more`.
        self._mc_get = fastget.MC_GET(
            store.env,
            store.dbs.data,
            flags_in_value,
            self._fast_more,
            _OBSERVE_GET,
            readstats.note_read,
            MAX_KEY,
            mc.MAX_LINE,
        )
        #: A filtered replica refuses a get of a key outside its keyspaces first (a miss
        #: would deny a key it does not hold: `reads/keyspaces.py`).
        self.fast: Callable[[bytes], bytes | None] = (
            self._mc_get if keyspaces.held() is None else self._fast_filtered
        )
        #: How a `get` (False) / `gets` (True) reply is read and encoded, a piece at a time
        #: when it is big (`reads.replystream`); one read transaction for the first pass.
        self._specs = {cas: self._spec(cas) for cas in (False, True)}

    def _spec(self, with_cas: bool) -> replystream.Spec[bytes, Hit]:
        flags = self.flags_in_value
        cut = len(mc.END)
        return replystream.Spec(
            fetch=_fetch,
            size=lambda hit: len(hit[1]),
            encode=lambda hits: mc.encode_values(hits, with_cas, flags)[:-cut],
            head=lambda _n: b"",
            tail=mc.END,
            max_bytes=MAX_REPLY_BYTES,
            slice_keys=BULK_SLICE,
        )

    def step(self, buf: bytearray) -> tuple[bytes, bool]:
        """Answer every complete command in `buf` at once (tests and tools)."""
        return drain(self.run(buf))

    def run(self, buf: bytearray) -> Run:
        """Answer the complete commands at the front of `buf`, deleting them (see
        `net.tcp.Session`): one step per command, a `get` of many keys in several."""
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
                if cmd.close:
                    buf.clear()
                    return True
            elif cmd.name in (b"get", b"gets"):
                refused = keyspaces.memcached_refusal(cmd.keys)
                if refused is not None:
                    yield refused
                else:
                    yield from self._get_pieces(cmd.keys, cmd.name == b"gets")
            elif cmd.name == b"quit":
                return True
            elif cmd.name == b"version":
                yield b"VERSION " + VERSION.encode() + b"\r\n"
            elif cmd.name == b"stats":
                # memcached answers ERROR to a `stats` subcommand it does not serve; ours
                # has none (no slabs, items, settings or conns to list)
                yield mc.ERROR if cmd.args else self._stats()
            elif cmd.name == b"verbosity":
                yield b"OK\r\n"
            else:
                yield from self.write(cmd)
        return False

    def write(self, cmd: mc.Command) -> Run:
        """A write command: refused on this read-only node (the root's write listener,
        memcached/writes.py, overrides this)."""
        if not cmd.noreply:
            yield mc.READ_ONLY
        return False

    def _fast_filtered(self, data: bytes) -> bytes | None:
        """`fast` on a filtered replica: a get line naming a key outside is refused, the
        rest answered as everywhere."""
        got = mc.get_line(data)
        refused = keyspaces.memcached_refusal(got[0]) if got is not None else None
        return refused if refused is not None else self._mc_get(data)

    def _fast_more(self, data: bytes) -> bytes | None:
        """What `fast` (`fastget.McGet`) hands back: the reply to `data` when it is one
        `get`/`gets` line of several keys (at most one slice of them), or of one key whose
        record is chunked or fails its CRC (`_get_small` reassembles it or reports the
        failure); None for anything else, which `run` then parses in full and answers in
        slices and pieces (`net.tcp.Fast`)."""
        got = mc.get_line(data)
        if got is None:
            return None
        keys, with_cas = got
        if not keys or len(keys) > BULK_SLICE:
            return None  # run's parser answers ERROR, or the run answers in slices
        if len(data) > MAX_KEY and any(len(k) > MAX_KEY for k in keys):
            return None  # run's parser answers CLIENT_ERROR
        return self._get_small(keys, with_cas)  # None when too big: run streams it

    @staticmethod
    def phase(buf: bytearray) -> str:
        """ "header" until the command line is complete, then "body" (a storage command's
        data block; see `net.tcp.Session`)."""
        return "body" if b"\n" in buf else "header"

    def _collect(
        self, keys: list[bytes], with_cas: bool, give_up_big: bool
    ) -> replystream.Collected[Hit]:
        gen = replystream.collect(self.store, keys, self._specs[with_cas], give_up_big=give_up_big)
        while True:  # at most one slice here (the fast path): nothing is yielded
            try:
                next(gen)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    def _get_small(self, keys: list[bytes], with_cas: bool) -> bytes | None:
        """The whole reply to a get of `keys`; None when it is too big to hold at once
        (`_get_pieces` answers it then)."""
        t0 = time.perf_counter()
        got = self._collect(keys, with_cas, give_up_big=True)
        if isinstance(got, replystream.Big):
            return None
        return self._whole(keys, got, with_cas, t0)

    def _get_slices(self, keys: list[bytes], with_cas: bool) -> Generator[bytes, None, bytes]:
        """The whole reply to a get of `keys`, however big, for callers that answer whole
        (`gat`): yields b"" between slices (other connections run), returns the reply."""
        parts: list[bytes] = []
        for piece in self._get_pieces(keys, with_cas):
            if piece:
                parts.append(piece)
            else:
                yield b""
        return b"".join(parts)

    def _get_pieces(self, keys: list[bytes], with_cas: bool) -> Generator[bytes, None, None]:
        """The reply to a get of `keys`: b"" between the slices of its first pass (other
        connections run), then the reply, in pieces when big (see `reads.replystream`: the
        connection asks for the next piece only as the client takes the last)."""
        t0 = time.perf_counter()
        got = yield from replystream.collect(self.store, keys, self._specs[with_cas])
        if not isinstance(got, replystream.Big):
            yield self._whole(keys, got, with_cas, t0)
            return
        _OBSERVE_GET(time.perf_counter() - t0)
        hit_keys = [keys[i] for i in got.hit_at]
        # counted once the reply can no longer be cut: a cut one answered no hits
        yield from replystream.stream(
            self.store, keys, got, self._specs[with_cas], lambda: self._count(keys, hit_keys)
        )

    def _whole(
        self,
        keys: list[bytes],
        got: replystream.Small[Hit] | replystream.TooLarge | replystream.Corrupt,
        with_cas: bool,
        t0: float,
    ) -> bytes:
        if isinstance(got, replystream.TooLarge):
            READ_ERRORS.labels("memcached_get", "too_large").inc()
            return b"SERVER_ERROR reply too large; ask for fewer keys\r\n"
        if isinstance(got, replystream.Corrupt):
            READ_ERRORS.labels("memcached_get", "crc").inc()
            return b"SERVER_ERROR " + got.err.message.encode("ascii", "replace") + b"\r\n"
        self._count(keys, [hit[0] for hit in got.hits])
        reply = mc.encode_values(got.hits, with_cas, self.flags_in_value)
        _OBSERVE_GET(time.perf_counter() - t0)
        return reply

    def _count(self, keys: list[bytes], hit_keys: list[bytes]) -> None:
        for k in hit_keys:
            readstats.note_read(k)
        self.cmd_get += len(keys)
        self.get_hits += len(hit_keys)
        self.get_misses += len(keys) - len(hit_keys)

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
                ("cmd_get", self.cmd_get + self._mc_get.cmd_get),
                ("get_hits", self.get_hits + self._mc_get.get_hits),
                ("get_misses", self.get_misses + self._mc_get.get_misses),
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
