"""The root's KT listener with writes: `KtWriteHandler` answers KT's write calls through a
`KtWriter` (kt/writes.py) and everything else as the read-only `KtHandler` does.

A write waits for its durable commit (the gateway's batch window) without holding the
listener: the session yields a `Wait` for the write's future, and the listener resumes it
once the future is done (`net/tcp.py`); other connections are served meanwhile, and a
connection's pipelined requests are still answered in order.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

from core import ttl
from core.errors import BadRequestError, ReadProtocolError
from kt import protocol as kt
from kt.server import WRITE_PROCEDURES, KtHandler, busy_reply_to
from kt.writes import KtWriteFailed, KtWriter, KtWrites
from net.tcp import ListenerLimits, TcpService, wait_for
from store.format import MAX_KEY
from store.store import Store

T = TypeVar("T")

#: RPC procedures answered here; KT's other writes (cursor writes, vacuum, tune_replication,
#: ulog_remove) are answered 501: not offered, rather than `KtHandler`'s "read-only node".
RPC_WRITES = frozenset(
    b"set add replace cas remove seize set_bulk remove_bulk increment increment_double "
    b"append clear synchronize".split()
)


class KtWriteHandler(KtHandler):
    """`KtHandler` plus KT's writes as one producer (see docs/kt-compat.md)."""

    def __init__(
        self,
        store: Store,
        writer: KtWriter,
        *,
        point_only: bool = True,
        connections: Callable[[], int] = lambda: 0,
        db_aliases: tuple[bytes, ...] = (),
    ) -> None:
        super().__init__(
            store, point_only=point_only, connections=connections, db_aliases=db_aliases
        )
        self.writes = KtWrites(store, writer)

    def _db_allowed(self, db: bytes | None) -> bool:
        return db is None or self._db_ok(db)

    def _report(self) -> dict[bytes, bytes]:
        out = super()._report()
        w = self.writes
        out[b"conf_kt_features"] = b"(Mercury root: writes as producer %s)" % (
            w.writer.producer.encode()
        )
        out[b"cnt_set"] = b"%d" % w.cnt_set
        out[b"cnt_set_misses"] = b"%d" % w.cnt_set_misses
        out[b"cnt_remove"] = b"%d" % w.cnt_remove
        out[b"cnt_remove_misses"] = b"%d" % w.cnt_remove_misses
        return out

    # --- HTTP ------------------------------------------------------------------------------

    def http_slices(self, req: kt.HttpRequest) -> Generator[bytes, None, tuple[bytes, bool]]:
        keep = req.keep_alive
        path = req.path
        if path.startswith(b"/rpc/"):
            proc = kt.url_decode(path[5:])
            if proc in RPC_WRITES or proc in WRITE_PROCEDURES:
                status, out = yield from self._rpc_write(proc, req)
                body, ctype = yield from kt.encode_tsv_slices(out)
                reply = kt.encode_http_response(
                    status,
                    body,
                    headers=[("Content-Type", ctype)],
                    keep_alive=keep,
                    date=self._http_date(),
                )
                return reply, keep
        elif req.method in ("PUT", "DELETE"):
            return (yield from self._rest_write(req, keep)), keep
        return (yield from super().http_slices(req))

    def _rest_write(self, req: kt.HttpRequest, keep: bool) -> Generator[bytes, None, bytes]:
        date = self._http_date()
        try:
            db, key = kt.rest_key(req.path)
        except ReadProtocolError as err:
            return kt.bad_path(err, keep, date)
        if not self._db_allowed(db):
            return kt.encode_http_response(
                400,
                b"no such database\n",
                headers=[("Content-Type", "text/plain")],
                keep_alive=keep,
                date=date,
            )
        w = self.writes
        try:
            if req.method == "PUT":
                mode = req.headers.get("x-kt-mode", "set").lower()
                if mode not in ("add", "replace"):
                    mode = "set"
                try:
                    deadline = ttl.kt_rest_deadline(req.headers.get("x-kt-xt"), ttl.now_us())
                except BadRequestError as err:
                    raise KtWriteFailed(
                        400, b"invalid parameters: " + err.message.encode()
                    ) from err
                yield from wait_for(w.set(key, req.body, mode, deadline))
                return kt.encode_http_response(201, keep_alive=keep, date=date)
            yield from wait_for(w.remove(key))
            return kt.encode_http_response(204, keep_alive=keep, date=date)
        except KtWriteFailed as err:
            # REST: a missing record on DELETE is 404; add/replace failures are 450
            status = 404 if req.method == "DELETE" and err.status == 450 else err.status
            return kt.encode_http_response(
                status,
                headers=[("X-Kt-Error", err.message.decode("latin-1"))],
                keep_alive=keep,
                date=date,
            )

    def _rpc_write(
        self, proc: bytes, req: kt.HttpRequest
    ) -> Generator[bytes, None, tuple[int, dict[bytes, bytes]]]:
        try:
            params = yield from kt.rpc_input_slices(req)
        except ReadProtocolError as err:
            return kt.bad_input(err)
        if not self._db_allowed(params.get(b"DB")):
            return 400, {b"ERROR": b"no such database"}
        refused = kt.signal_refusal(params)
        if refused is not None:
            return refused
        if proc not in RPC_WRITES:
            return 501, {b"ERROR": b"not implemented: " + proc + b" (Mercury root)"}
        if proc == b"synchronize":
            # every acknowledged write is already durable (each batch commits with fsync)
            return 200, {}
        key = params.get(b"key")
        try:
            deadline = ttl.kt_deadline(params.get(b"xt"), ttl.now_us())
        except BadRequestError as err:
            return 400, {b"ERROR": b"invalid parameters: " + err.message.encode()}
        try:
            if proc in (b"set_bulk", b"remove_bulk"):
                keys = [(k[1:], v) for k, v in params.items() if k.startswith(b"_")]
                if proc == b"set_bulk":
                    n = yield from wait_for(self.writes.set_bulk(keys, deadline))
                else:
                    n = yield from wait_for(self.writes.remove_bulk([k for k, _ in keys]))
                return 200, {b"num": b"%d" % n}
            if proc == b"clear":
                yield from wait_for(self.writes.clear())
                return 200, {}
            if key is None:
                return 400, {b"ERROR": b"invalid parameters"}
            if not 1 <= len(key) <= MAX_KEY:
                return 400, {b"ERROR": b"invalid parameters: keys are 1 to %d bytes" % MAX_KEY}
            if proc in (b"set", b"add", b"replace", b"append"):
                value = params.get(b"value")
                if value is None:
                    return 400, {b"ERROR": b"invalid parameters"}
                if proc == b"append":
                    yield from wait_for(self.writes.append(key, value))
                else:
                    yield from wait_for(self.writes.set(key, value, proc.decode(), deadline))
                return 200, {}
            if proc == b"remove":
                yield from wait_for(self.writes.remove(key))
                return 200, {}
            if proc == b"seize":
                value = yield from wait_for(self.writes.seize(key))
                return 200, {b"value": value}
            if proc == b"cas":
                yield from wait_for(self.writes.cas(key, params.get(b"oval"), params.get(b"nval")))
                return 200, {}
            # increment, increment_double
            double = proc == b"increment_double"
            parse = float if double else int
            try:
                num = parse(params.get(b"num", b"").decode("latin-1"))
            except ValueError:
                return 400, {b"ERROR": b"invalid parameters"}
            orig_raw = params.get(b"orig")
            orig = orig_raw.decode("latin-1") if orig_raw is not None else None
            if orig not in (None, "try", "set"):
                try:
                    parse(orig or "")
                except ValueError:
                    return 400, {b"ERROR": b"invalid parameters"}
            if double:
                dnew = yield from wait_for(self.writes.increment_double(key, float(num), orig))
                return 200, {b"num": b"%f" % dnew}
            new = yield from wait_for(self.writes.increment(key, int(num), orig))
            return 200, {b"num": b"%d" % new}
        except KtWriteFailed as err:
            return err.status, {b"ERROR": err.message}

    # --- binary ----------------------------------------------------------------------------

    def binary_slices(self, req: kt.BinaryRequest) -> Generator[bytes, None, bytes]:
        if req.magic not in (kt.MAGIC_SET_BULK, kt.MAGIC_REMOVE_BULK):
            return (yield from super().binary_slices(req))
        # KT skips the records of databases it does not have
        try:
            if req.magic == kt.MAGIC_SET_BULK:
                now = ttl.now_us()
                records = [
                    (k, v, ttl.kt_binary_deadline(xt, now))
                    for (dbidx, k), v, xt in zip(req.keys, req.values, req.xts, strict=True)
                    if dbidx == 0
                ]
                n = yield from wait_for(self.writes.set_records(records))
            else:
                keys = [k for dbidx, k in req.keys if dbidx == 0]
                n = yield from wait_for(self.writes.remove_bulk(keys))
        except (KtWriteFailed, BadRequestError):  # a refused write, or an xt out of bounds
            return b"" if req.no_reply else kt.BINARY_ERROR
        return b"" if req.no_reply else kt.bulk_count_reply(req.magic, n)


def kt_write_service(
    store: Store,
    host: str,
    port: int,
    writer: KtWriter,
    *,
    limits: ListenerLimits | None = None,
    db_aliases: tuple[bytes, ...] = (),
) -> TcpService:
    """The root's KT listener with writes as a `Service`."""
    holder: list[TcpService] = []
    handler = KtWriteHandler(
        store,
        writer,
        connections=lambda: holder[0].connections,
        db_aliases=db_aliases,
    )
    svc = TcpService("kt", host, port, handler.session, limits=limits, busy_reply_to=busy_reply_to)
    holder.append(svc)
    return svc
