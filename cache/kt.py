"""The cache node's Kyoto Tycoon listener (`mercury cache --kt-listen`).

KT's point and bulk reads as a replica's KT listener answers them (`kt.server`): RESTful
GET/HEAD, TSV-RPC `get`, `check`, `get_bulk` (and `void`, `echo`, `status`, `report`), and
the binary get_bulk, parsed and encoded by the same `kt.protocol` code and refused with the
same error shapes (every write: KT's "no permission"). The values come from the cache
engine (`cache.node.CacheNode.get`): a hit from the local store, a miss fetched from the
source, awaited without holding the event loop (`net.tcp.wait_for`).

What a cache cannot answer truthfully is refused, never answered partially: the calls that
walk the key space (`match_prefix`, `match_regex`, `match_similar`, the `cur_*` cursor) get
KT's 501 "not implemented" naming the cache's sources (read ranges from a replica); a miss
whose source cannot answer gets 503 (+ Retry-After on HTTP; the binary protocol's error
magic), never a "no record". A cache learns no expiry deadlines from its stream (a key's
expiry reaches it as the key's removal), so its answers carry no `xt`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Sequence

from cache.node import Answer, CacheNode, TooLarge, Unavailable
from core.errors import ReadProtocolError
from kt import protocol as kt
from kt.server import NO_PERMISSION, NO_RECORD, WRITE_PROCEDURES, busy_reply_to
from net.tcp import ListenerLimits, Run, TcpService, wait_for
from reads.metrics import READ_ERRORS
from replicator.invalidation import MAX_FETCH_KEYS
from store.format import MAX_KEY

#: KT calls that walk the key space: a cache holds only what was read, so it cannot.
RANGE_PROCEDURES = frozenset(
    b"match_prefix match_regex match_similar cur_jump cur_jump_back cur_step "
    b"cur_step_back cur_get cur_get_key cur_get_value cur_delete".split()
)
#: Seconds a client is told to wait before retrying a 503 (as the cache's HTTP API).
RETRY_AFTER = "1"

Rpc = tuple[int, dict[bytes, bytes]]


class _Refused(Exception):
    """A read the cache cannot answer now: (status, KT error text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class CacheKt:
    """Answers KT requests through a `CacheNode`; one per listener, KT's `cnt_*` counters."""

    def __init__(
        self,
        node: CacheNode,
        db_name: bytes,
        *,
        refuse_when_lagging: bool = False,
        connections: Callable[[], int] = lambda: 0,
        db_aliases: tuple[bytes, ...] = (),
    ) -> None:
        self.node = node
        self.db_name = db_name
        #: Other database names clients use for database 0 (`--kt-db-alias`, as a replica's).
        self.db_aliases = frozenset(db_aliases)
        self.refuse_when_lagging = refuse_when_lagging
        self.connections = connections
        self.started = time.time()
        self.cnt_get = 0
        self.cnt_get_misses = 0
        self.cnt_misc = 0

    def session(self) -> CacheKtSession:
        return CacheKtSession(self)

    # --- the engine --------------------------------------------------------------------

    def _get(self, keys: Sequence[bytes]) -> Generator[bytes, None, list[Answer]]:
        """The cache's answers for `keys` (valid ones), or `_Refused`."""
        if self.refuse_when_lagging and self.node.lagging():
            raise _Refused(
                503,
                f"DB: 6: lagging: this cache is more than {self.node.max_lag:g} s behind "
                "its root; it serves nothing until it catches up",
            )
        if len(keys) > MAX_FETCH_KEYS:
            raise _Refused(
                400, f"invalid parameters: at most {MAX_FETCH_KEYS} keys per call on a cache node"
            )
        try:
            answers = yield from wait_for(self.node.get(keys))
        except Unavailable as err:
            raise _Refused(
                503, f"DB: 6: source unavailable: the cache cannot fetch a miss now ({err})"
            ) from None
        except TooLarge as err:
            raise _Refused(400, f"invalid parameters: {err}") from None
        self.cnt_get += len(keys)
        self.cnt_get_misses += sum(a.value is None for a in answers)
        return answers

    def _range_refusal(self, proc: bytes) -> Rpc:
        sources = ", ".join(f"{h}:{p}" for h, p in self.node.sources)
        return 501, {
            b"ERROR": b"not implemented: %s on a cache node (it holds only the keys read); "
            b"read ranges from a replica; this cache's sources are %s (replication addresses)"
            % (proc, sources.encode())
        }

    # --- binary ------------------------------------------------------------------------

    def binary(self, req: kt.BinaryRequest) -> Generator[bytes, None, bytes]:
        if req.magic != kt.MAGIC_GET_BULK:
            self.cnt_misc += 1  # writes, scripts, replication: not on a read-only node
            return b"" if req.no_reply else kt.BINARY_ERROR
        # KT skips unknown databases silently; an impossible key is simply absent.
        wanted = [(db, k) for db, k in req.keys if db == 0 and 1 <= len(k) <= MAX_KEY]
        try:
            answers = yield from self._get([k for _db, k in wanted])
        except _Refused:
            READ_ERRORS.labels("kt_get_bulk", "cache_refused").inc()
            return kt.BINARY_ERROR
        self.cnt_get += len(req.keys) - len(wanted)
        self.cnt_get_misses += len(req.keys) - len(wanted)
        return kt.encode_get_bulk_reply(
            [
                (db, k, a.value, kt.XT_NONE)
                for (db, k), a in zip(wanted, answers, strict=True)
                if a.value is not None
            ]
        )

    # --- HTTP --------------------------------------------------------------------------

    def http(self, req: kt.HttpRequest) -> Generator[bytes, None, tuple[bytes, bool]]:
        keep = req.keep_alive
        if not req.path.startswith(b"/rpc/"):
            reply = yield from self._rest(req, keep)
            return reply, keep
        status, out = yield from self._rpc(kt.url_decode(req.path[5:]), req)
        pieces, ctype = yield from kt.tsv_pieces(out)
        headers = [("Content-Type", ctype)]
        if status == 503:
            headers.append(("Retry-After", RETRY_AFTER))
        head = kt.encode_http_response(
            status,
            headers=headers,
            keep_alive=keep,
            head=True,
            content_length=sum(map(len, pieces)),
        )
        return head + b"".join(pieces), keep

    def _db_ok(self, db: bytes) -> bool:
        return db in (b"0", self.db_name) or db in self.db_aliases

    def _rest(self, req: kt.HttpRequest, keep: bool) -> Generator[bytes, None, bytes]:
        if req.method not in ("GET", "HEAD", "PUT", "DELETE"):
            return kt.encode_http_response(501, keep_alive=keep)
        try:
            db, key = kt.rest_key(req.path)
        except ReadProtocolError as err:
            return kt.bad_path(err, keep, None)
        if db is not None and not self._db_ok(db):
            return kt.encode_http_response(
                400,
                b"no such database\n",
                headers=[("Content-Type", "text/plain")],
                keep_alive=keep,
            )
        if req.method in ("PUT", "DELETE"):
            self.cnt_misc += 1
            return kt.encode_http_response(
                500, headers=[("X-Kt-Error", NO_PERMISSION.decode())], keep_alive=keep
            )
        if not 1 <= len(key) <= MAX_KEY:
            self.cnt_get += 1
            self.cnt_get_misses += 1
            return kt.encode_http_response(
                404, headers=[("X-Kt-Error", NO_RECORD.decode())], keep_alive=keep
            )
        try:
            (a,) = yield from self._get([key])
        except _Refused as err:
            extra = [("Retry-After", RETRY_AFTER)] if err.status == 503 else []
            return kt.encode_http_response(
                err.status, headers=[("X-Kt-Error", err.message), *extra], keep_alive=keep
            )
        cache = [("X-Mercury-Cache", a.served)]
        if a.value is None:
            return kt.encode_http_response(
                404, headers=[("X-Kt-Error", NO_RECORD.decode()), *cache], keep_alive=keep
            )
        return kt.encode_http_response(
            200,
            a.value,
            headers=cache,
            keep_alive=keep,
            head=req.method == "HEAD",
            content_length=len(a.value),
        )

    def _rpc(self, proc: bytes, req: kt.HttpRequest) -> Generator[bytes, None, Rpc]:
        try:
            params = yield from kt.rpc_input_slices(req)
        except ReadProtocolError as err:
            return kt.bad_input(err)
        db = params.get(b"DB")
        if db is not None and not self._db_ok(db):
            return 400, {b"ERROR": b"no such database"}
        refused = kt.signal_refusal(params)
        if refused is not None:
            self.cnt_misc += 1
            return refused
        if proc in WRITE_PROCEDURES:
            self.cnt_misc += 1
            return 500, {b"ERROR": NO_PERMISSION}
        if proc in RANGE_PROCEDURES:
            self.cnt_misc += 1
            return self._range_refusal(proc)
        try:
            if proc in (b"get", b"check"):
                return (yield from self._rpc_get(params, want_value=proc == b"get"))
            if proc == b"get_bulk":
                return (yield from self._rpc_get_bulk(params))
        except _Refused as err:
            return err.status, {b"ERROR": err.message.encode()}
        if proc == b"void":
            return 200, {}
        if proc == b"echo":
            return 200, params
        if proc == b"status":
            return 200, self._status()
        if proc == b"report":
            return 200, self._report()
        if proc == b"play_script":
            return 501, {b"ERROR": b"the scripting extention is disabled"}
        return 501, {b"ERROR": b"not implemented: " + proc}

    def _rpc_get(
        self, params: dict[bytes, bytes], *, want_value: bool
    ) -> Generator[bytes, None, Rpc]:
        key = params.get(b"key")
        if key is None:
            return 400, {b"ERROR": b"invalid parameters"}
        if not 1 <= len(key) <= MAX_KEY:
            return 450, {b"ERROR": NO_RECORD}
        (a,) = yield from self._get([key])
        if a.value is None:
            return 450, {b"ERROR": NO_RECORD}
        return 200, {b"value": a.value} if want_value else {b"vsiz": b"%d" % len(a.value)}

    def _rpc_get_bulk(self, params: dict[bytes, bytes]) -> Generator[bytes, None, Rpc]:
        keys = [k[1:] for k in params if k.startswith(b"_") and 1 <= len(k) - 1 <= MAX_KEY]
        answers = yield from self._get(keys)
        out = {b"_" + k: a.value for k, a in zip(keys, answers, strict=True) if a.value is not None}
        out[b"num"] = b"%d" % len(out)
        return 200, out

    def _status(self) -> dict[bytes, bytes]:
        st = self.node.status()
        return {
            b"count": b"%d" % int(str(st["entries"])),
            b"size": b"%d" % int(str(st["bytes"])),
            b"type": b"mercury-cache",
        }

    def _report(self) -> dict[bytes, bytes]:
        st = self.node.status()
        now = time.time()
        count, size = int(str(st["entries"])), int(str(st["bytes"]))
        return {
            b"conf_kt_version": b"1.0.0 (Mercury)",
            b"conf_kt_features": b"(read-only Mercury cache node)",
            b"db_total_count": b"%d" % count,
            b"db_total_size": b"%d" % size,
            b"serv_conn_count": b"%d" % self.connections(),
            b"serv_current_time": b"%d" % int(now),
            b"serv_running_term": b"%.6f" % (now - self.started),
            b"serv_proc_id": b"%d" % os.getpid(),
            b"cnt_get": b"%d" % self.cnt_get,
            b"cnt_get_misses": b"%d" % self.cnt_get_misses,
            b"cnt_misc": b"%d" % self.cnt_misc,
        }


class CacheKtSession:
    """One KT connection: the replica's request loop (`kt.server.KtSession`) over a
    `CacheKt` (its incremental binary and HTTP parsers, KT's answer to a bad request)."""

    def __init__(self, handler: CacheKt) -> None:
        self.h = handler
        self.parser = kt.BinaryParser()
        self.http = kt.HttpParser()

    def phase(self, buf: bytearray) -> str:
        if self.parser.busy:
            return "body"
        if kt.is_binary(buf[0]):
            return kt.binary_phase(buf)
        return "body" if self.http.head_done else "header"

    def run(self, buf: bytearray) -> Run:
        while buf:
            try:
                if self.parser.busy or kt.is_binary(buf[0]):
                    got_b = self.parser.feed(buf)
                    if got_b is None:
                        if self.parser.starved:
                            return False
                        yield b""
                        continue
                    breq, n = got_b
                    del buf[:n]
                    yield (yield from self.h.binary(breq))
                    continue
                got_h = self.http.feed(buf)
                if got_h is None:
                    return False
                hreq, n = got_h
                del buf[:n]
                reply, keep = yield from self.h.http(hreq)
                yield reply
                if not keep:
                    return True
            except ReadProtocolError as err:
                self.parser.reset()
                self.http.reset()
                READ_ERRORS.labels("kt", "protocol").inc()
                buf.clear()
                if err.status is not None:
                    yield kt.encode_http_response(
                        err.status,
                        kt.error_body(err.status, err.message),
                        headers=[("Content-Type", "text/plain")],
                        keep_alive=False,
                    )
                return True
        return False


def cache_kt_service(
    node: CacheNode,
    db_name: bytes,
    host: str,
    port: int,
    *,
    refuse_when_lagging: bool = False,
    limits: ListenerLimits | None = None,
    db_aliases: tuple[bytes, ...] = (),
) -> TcpService:
    """The cache's KT listener as a `Service` (bounded as a replica's: `net.tcp`)."""
    holder: list[TcpService] = []
    handler = CacheKt(
        node,
        db_name,
        refuse_when_lagging=refuse_when_lagging,
        connections=lambda: holder[0].connections,
        db_aliases=db_aliases,
    )
    svc = TcpService("kt", host, port, handler.session, limits=limits, busy_reply_to=busy_reply_to)
    holder.append(svc)
    return svc
