"""memcached writes on the root's memcached listener, as one producer (`--memcached-producer`).

The same seam as the root's KT writes (`kt/writes.py: KtWriter`): the listener never
imports the gateway, the composition root hands it a writer over the gateway's write path,
so a memcached write is one request of the producer — ACL, guards, quotas, batching — and
is answered only after its durable commit.

memcached's semantics on Mercury's ops: `add` is a set conditional on absence; `replace`,
`append`, `prepend`, `incr` and `decr` read the current value and write conditionally on
its seq (read again when another writer got in between); `cas` is conditional on the CAS
unique, which is the value's seq (what `gets` answers: it changes exactly when the value
does). `flush_all` deletes every key of the producer's keyspaces in one write (the
mass-delete guard applies). An `exptime` gives the key a deadline (`core/ttl.py`:
relative seconds up to 30 days, a Unix time beyond; 1 s to one year ahead, else
`CLIENT_ERROR` naming the bound) that the root's expirer acts on like any other; a `set`
whose exptime is already past (negative, or a Unix time not after now) deletes the key, as
memcached would expire it at once. `append`, `prepend`, `incr` and `decr` keep the key's
deadline, as memcached keeps the item's; `touch` sets a new one (0: none). `gat`/`gats`
with an exptime other than 0 are refused. Flags are kept as KT's memcached
plug-in keeps them (`opts=f`: the value's last 4 bytes, big-endian) when the listener runs
with `--memcached-flags`; without it a set with flags other than 0 is refused.

A `noreply` write is still applied in order: the connection's next command waits for its
commit, so a `get` after a `set ... noreply` sees the value. As in memcached, a refused
`noreply` write answers nothing.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Generator

from core import ttl
from core.errors import BadRequestError, MercuryError, TooLargeError
from core.problems import classify
from kt.writes import MAX_CLEAR, RMW_ATTEMPTS, KtWriter, keys_to_clear
from memcached import protocol as mc
from memcached.server import BUSY, MemcachedHandler
from net.metrics import READ_ERRORS
from net.tcp import ListenerLimits, Run, TcpService, wait_for
from store.ops import DELETE, SET, Op, Result, Status
from store.store import Store

STORED = b"STORED\r\n"
NOT_STORED = b"NOT_STORED\r\n"
EXISTS = b"EXISTS\r\n"
NOT_FOUND = b"NOT_FOUND\r\n"
DELETED = b"DELETED\r\n"
TOUCHED = b"TOUCHED\r\n"
OK = b"OK\r\n"
BAD_FORMAT = mc.client_error("bad command line format")
NO_EXPIRY = mc.client_error("gat/gats take exptime 0 here (touch sets a key's deadline)")
NO_DELAYED_FLUSH = mc.client_error("flush_all takes no delay here; send it when it is due")
EXPIRED_ONLY_SET = mc.client_error("an exptime already past is taken by set only")
NO_FLAGS = mc.client_error(
    "flags are not kept by this listener (the root's --memcached-flags keeps them); send flags 0"
)
NON_NUMERIC = mc.client_error("cannot increment or decrement non-numeric value")
BAD_DELTA = mc.client_error("invalid numeric delta argument")
BUSY_KEY = b"SERVER_ERROR the key kept changing; retry\r\n"

_U32 = 1 << 32
_U64 = 1 << 64


class Refused(Exception):
    """A write answered with the status line `reply` instead of its success word."""

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply.decode("latin-1").strip())
        self.reply = reply


def refusal(err: MercuryError) -> bytes:
    """memcached's status line for a write the gateway refused. A value over the limit is
    memcached's own `SERVER_ERROR object too large for cache`; a refusal that can succeed
    later (rate quota, shutting down) is a `SERVER_ERROR`; a client fault that never will
    (ACL, guard, key size) a `CLIENT_ERROR`."""
    text = str(err).replace("\r", " ").replace("\n", " ")
    if isinstance(err, TooLargeError):
        return b"SERVER_ERROR object too large for cache: " + text.encode() + b"\r\n"
    status = classify(err).status
    if 400 <= status < 500 and status != 429:
        return mc.client_error(text)
    return b"SERVER_ERROR " + text.encode() + b"\r\n"


def _uint(raw: bytes, bound: int) -> int | None:
    """A decimal unsigned integer below `bound`, or None."""
    if not raw.isdigit():
        return None
    n = int(raw)
    return n if n < bound else None


def _deadline(raw: bytes) -> int | bytes:
    """The deadline of an `exptime` argument (`core/ttl.py`), or the CLIENT_ERROR reply
    naming what is wrong with it."""
    neg = raw[:1] == b"-"
    digits = raw[1:] if neg else raw
    if not digits.isdigit() or len(digits) > 19:
        return BAD_FORMAT
    try:
        return ttl.memcached_deadline(-int(digits) if neg else int(digits), ttl.now_us())
    except BadRequestError as err:
        return mc.client_error(err.message.replace("ttl", "exptime", 1))


def with_flags(data: bytes, flags: int, flags_in_value: bool) -> bytes:
    """The stored value of a memcached item: the data, then the flags as 4 big-endian
    bytes when flags are kept (`opts=f`)."""
    return data + flags.to_bytes(4, "big") if flags_in_value else data


def split_flags(value: bytes, flags_in_value: bool) -> tuple[bytes, int]:
    """(data, flags) of a stored value (the inverse of `with_flags`; a value shorter than 4
    bytes has flags 0, as `memcached_protocol.encode_values` serves it)."""
    if flags_in_value and len(value) >= 4:
        return value[:-4], int.from_bytes(value[-4:], "big")
    return value, 0


def incr_decr(current: bytes, delta: int, incr: bool) -> int | None:
    """memcached's arithmetic on a decimal value: incr wraps at 2**64, decr stops at 0;
    None when `current` is not a decimal number below 2**64 (memcached ignores trailing
    spaces, which its own decr leaves when a number gets shorter)."""
    n = _uint(current.rstrip(b" "), _U64)
    if n is None:
        return None
    return (n + delta) % _U64 if incr else max(0, n - delta)


class MemcachedWrites:
    """The write commands over `store` (reads of the current value) and `writer`."""

    def __init__(self, store: Store, writer: KtWriter, *, flags_in_value: bool) -> None:
        self.store = store
        self.writer = writer
        self.flags_in_value = flags_in_value

    async def _write(self, ops: list[Op]) -> list[Result]:
        nbytes = sum(len(op.key) + len(op.value) for op in ops)
        try:
            return await self.writer.write(ops, nbytes)
        except MercuryError as err:
            raise Refused(refusal(err)) from err

    async def _one(self, op: Op) -> Result:
        return (await self._write([op]))[0]

    async def store_cmd(
        self, verb: bytes, key: bytes, flags: int, data: bytes, deadline: int = 0
    ) -> bytes:
        """set / add / replace / append / prepend: the reply word. `deadline`: µs, 0 for
        none, `ttl.EXPIRED_NOW` for an item already expired (only a set takes it)."""
        if deadline == ttl.EXPIRED_NOW:
            if verb != b"set":
                return EXPIRED_ONLY_SET
            await self._one(Op(DELETE, key))  # memcached would expire it at once
            return STORED
        if verb == b"set":
            value = with_flags(data, flags, self.flags_in_value)
            await self._one(Op(SET, key, value, deadline=deadline))
            return STORED
        if verb == b"add":
            op = Op(
                SET,
                key,
                with_flags(data, flags, self.flags_in_value),
                expect_seq=0,
                deadline=deadline,
            )
            r = await self._one(op)
            return NOT_STORED if r.status is Status.PRECONDITION_FAILED else STORED
        for _ in range(RMW_ATTEMPTS):
            cur = self.store.get(key)
            if cur is None:
                return NOT_STORED
            if verb == b"replace":
                new = with_flags(data, flags, self.flags_in_value)
                dl = deadline
            else:  # append / prepend keep the item's flags and deadline, as memcached does
                old, old_flags = split_flags(cur.value, self.flags_in_value)
                joined = old + data if verb == b"append" else data + old
                new = with_flags(joined, old_flags, self.flags_in_value)
                dl = cur.expires_us
            r = await self._one(Op(SET, key, new, expect_seq=cur.seq, deadline=dl))
            if r.status is not Status.PRECONDITION_FAILED:
                return STORED
        return BUSY_KEY

    async def cas(
        self, key: bytes, flags: int, data: bytes, unique: int, deadline: int = 0
    ) -> bytes:
        """cas: STORED when the value's seq is still `unique`; EXISTS when it changed;
        NOT_FOUND when the key is absent."""
        if deadline == ttl.EXPIRED_NOW:
            return EXPIRED_ONLY_SET
        cur = self.store.get(key)
        if cur is None:
            return NOT_FOUND
        if cur.seq != unique:
            return EXISTS
        value = with_flags(data, flags, self.flags_in_value)
        op = Op(SET, key, value, expect_seq=unique, deadline=deadline)
        r = await self._one(op)
        if r.status is Status.PRECONDITION_FAILED:
            return NOT_FOUND if r.seq == 0 else EXISTS
        return STORED

    async def delete(self, key: bytes) -> bytes:
        r = await self._one(Op(DELETE, key))
        return NOT_FOUND if r.status is Status.ABSENT else DELETED

    async def incr_decr(self, key: bytes, delta: int, incr: bool) -> bytes:
        """incr / decr: the new number, NOT_FOUND, or the non-numeric CLIENT_ERROR."""
        for _ in range(RMW_ATTEMPTS):
            cur = self.store.get(key)
            if cur is None:
                return NOT_FOUND
            data, flags = split_flags(cur.value, self.flags_in_value)
            new = incr_decr(data, delta, incr)
            if new is None:
                return NON_NUMERIC
            digits = b"%d" % new
            value = with_flags(digits, flags, self.flags_in_value)
            op = Op(SET, key, value, expect_seq=cur.seq, deadline=cur.expires_us)
            r = await self._one(op)
            if r.status is not Status.PRECONDITION_FAILED:
                return digits + b"\r\n"
        return BUSY_KEY

    async def touch(self, key: bytes, deadline: int) -> bytes:
        """touch: the key's value again with deadline `deadline` (0: none); TOUCHED or
        NOT_FOUND (an already-expired deadline deletes the key)."""
        for _ in range(RMW_ATTEMPTS):
            cur = self.store.get(key)
            if cur is None:
                return NOT_FOUND
            if deadline == ttl.EXPIRED_NOW:
                r = await self._one(Op(DELETE, key, expect_seq=cur.seq))
            else:
                r = await self._one(Op(SET, key, cur.value, expect_seq=cur.seq, deadline=deadline))
            if r.status is not Status.PRECONDITION_FAILED:
                return TOUCHED
        return BUSY_KEY

    async def flush_all(self) -> bytes:
        """Delete every key of the producer's keyspaces in one write."""
        keys = keys_to_clear(self.store, self.writer)
        if keys is None:
            return mc.client_error(
                f"flush_all deletes at most {MAX_CLEAR} keys at once; delete them in parts"
            )
        if keys:
            await self._write([Op(DELETE, k) for k in keys])
        return OK


#: The write counters `stats` reports, as memcached names them.
WRITE_STATS = (
    "cmd_set",
    "cmd_touch",
    "cmd_flush",
    "delete_hits",
    "delete_misses",
    "incr_hits",
    "incr_misses",
    "decr_hits",
    "decr_misses",
    "cas_hits",
    "cas_misses",
    "cas_badval",
    "touch_hits",
    "touch_misses",
)


def stat_names(name: bytes, reply: bytes) -> list[str]:
    """The counters one write command moves, from its verb and its reply (memcached's
    meaning: `cmd_set` counts every storage command, `*_hits`/`*_misses` found or not)."""
    out: list[str] = []
    if name in mc.STORAGE:
        out.append("cmd_set")
        if name == b"cas":
            out += {STORED: ["cas_hits"], EXISTS: ["cas_badval"], NOT_FOUND: ["cas_misses"]}.get(
                reply, []
            )
    elif name == b"delete":
        out += {DELETED: ["delete_hits"], NOT_FOUND: ["delete_misses"]}.get(reply, [])
    elif name in (b"incr", b"decr"):
        verb = name.decode()
        if reply == NOT_FOUND:
            out.append(f"{verb}_misses")
        elif reply[:1].isdigit():
            out.append(f"{verb}_hits")
    elif name == b"touch":
        out.append("cmd_touch")
        out += {TOUCHED: ["touch_hits"], NOT_FOUND: ["touch_misses"]}.get(reply, [])
    elif name == b"flush_all":
        out.append("cmd_flush")
    return out


class MemcachedWriteHandler(MemcachedHandler):
    """`MemcachedHandler` plus memcached's writes as one producer (docs/kt-compat.md)."""

    def __init__(
        self,
        store: Store,
        writer: KtWriter,
        connections: Callable[[], int] = lambda: 0,
        *,
        flags_in_value: bool = False,
    ) -> None:
        super().__init__(store, connections, flags_in_value=flags_in_value)
        self.writes = MemcachedWrites(store, writer, flags_in_value=flags_in_value)
        #: memcached's write counters (`stats`): cmd_set, delete_hits, cas_badval...
        self.counts: collections.Counter[str] = collections.Counter()

    def _stats(self) -> bytes:
        """memcached's `stats`, with the write counters of this listener."""
        base = super()._stats()
        assert base.endswith(mc.END)
        extra = mc.encode_stats([(n, self.counts[n]) for n in WRITE_STATS])
        return base[: -len(mc.END)] + extra

    def write(self, cmd: mc.Command) -> Run:
        reply = yield from self._answer(cmd)
        self.counts.update(stat_names(cmd.name, reply))
        if reply.startswith((b"CLIENT_ERROR", b"SERVER_ERROR", b"ERROR")):
            # a refused noreply write tells its client nothing: the metric is what does
            READ_ERRORS.labels("memcached_write", "noreply" if cmd.noreply else "refused").inc()
        if not cmd.noreply:
            yield reply
        return False

    def _answer(self, cmd: mc.Command) -> Generator[bytes, None, bytes]:
        """The reply line of one write command (the caller drops it for `noreply`)."""
        name, args = cmd.name, cmd.args
        if cmd.noreply:
            args = args[:-1]
        w = self.writes
        try:
            if name in mc.STORAGE:
                flags = _uint(args[1], _U32)
                if flags is None:
                    return BAD_FORMAT
                if flags and not self.flags_in_value:
                    return NO_FLAGS
                dl = _deadline(args[2])
                if isinstance(dl, bytes):
                    return dl
                if name == b"cas":
                    unique = _uint(args[4], _U64) if len(args) == 5 else None
                    if unique is None:
                        return BAD_FORMAT
                    return (yield from wait_for(w.cas(args[0], flags, cmd.data, unique, dl)))
                return (yield from wait_for(w.store_cmd(name, args[0], flags, cmd.data, dl)))
            if name == b"delete":
                # memcached accepts a legacy time argument of 0 only
                if len(args) not in (1, 2) or args[1:] not in ([], [b"0"]):
                    return BAD_FORMAT
                return (yield from wait_for(w.delete(args[0])))
            if name in (b"incr", b"decr"):
                if len(args) != 2:
                    return BAD_FORMAT
                delta = _uint(args[1], _U64)
                if delta is None:
                    return BAD_DELTA
                return (yield from wait_for(w.incr_decr(args[0], delta, name == b"incr")))
            if name == b"touch":
                if len(args) != 2:
                    return BAD_FORMAT
                dl = _deadline(args[1])
                if isinstance(dl, bytes):
                    return dl
                return (yield from wait_for(w.touch(args[0], dl)))
            if name in (b"gat", b"gats"):
                if len(args) < 2:
                    return mc.ERROR
                if args[0] != b"0":
                    return NO_EXPIRY
                return (yield from self._get_slices(args[1:], name == b"gats"))
            if name == b"flush_all":
                if args not in ([], [b"0"]):
                    return NO_DELAYED_FLUSH
                return (yield from wait_for(w.flush_all()))
        except Refused as err:
            return err.reply
        return mc.ERROR


def memcached_write_service(
    store: Store,
    host: str,
    port: int,
    writer: KtWriter,
    *,
    limits: ListenerLimits | None = None,
    flags_in_value: bool = False,
) -> TcpService:
    """The root's memcached listener with writes as a `Service`."""
    holder: list[TcpService] = []
    handler = MemcachedWriteHandler(
        store, writer, connections=lambda: holder[0].connections, flags_in_value=flags_in_value
    )
    svc = TcpService("memcached", host, port, lambda: handler, limits=limits, busy_reply=BUSY)
    holder.append(svc)
    return svc
