"""The Kyoto Tycoon protocol listener (`--kt-listen`): RESTful GET/HEAD, TSV-RPC reads and
the binary get_bulk, over the store. Writes get KT's own error shapes.

`KtHandler` turns one parsed request into reply bytes (synchronous, short read
transactions); `KtSession` is one connection's state (its incremental binary parser) and
runs the handler in slices (see `net.tcp`): a binary get_bulk is parsed `PARSE_SLICE`
records and read `BULK_SLICE` keys at a time, each slice in its own read transaction, so
other connections are served in between (as in KT, a get_bulk is not one snapshot).
`kt_service()` wraps it in a `TcpService`. On the root (`point_only`), only
point and bulk reads are served: `match_prefix` is refused (range reads belong on consumer
nodes).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator

from core import ttl
from core.errors import CRCError, ReadProtocolError
from core.slices import CHUNK, SliceClock
from kt import protocol as kt
from net.tcp import ListenerLimits, Run, TcpService, drain
from reads import keyspaces, readstats, replystream
from reads.metrics import READ_ERRORS, READ_SECONDS
from reads.ranges import make_spec, read_page
from reads.replystream import BULK_SLICE
from store.format import MAX_KEY
from store.reader import Reader
from store.store import Store

#: `match_prefix` without `max` answers at most this many keys (KT has no bound; a node
#: must). Beyond it the call is refused with a hint to page with GET /v1/range.
MAX_MATCH = 1_000_000
#: Keys read per read transaction while matching (keeps transactions short).
MATCH_CHUNK = 10_000
#: Bytes of values one get_bulk (RPC or binary) may answer; beyond it the call fails.
MAX_BULK_BYTES = 256 << 20

#: An HTTP client over the connection cap (KT itself just closes: this says why).
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 26\r\nConnection: close\r\n\r\ntoo many open connections\n"
)


def busy_reply_to(first: int | None) -> bytes | None:
    """What a KT client refused at the connection cap is sent, by the first byte it sent
    (`net.tcp.TcpService.busy_reply_to`): a binary client (a binary magic, `kt.is_binary`)
    nothing — the connection just closes, as KT's own server closes, since a binary client
    cannot parse HTTP and would read `H` as a bad magic; an HTTP client, or one that sent
    nothing in time, the 503."""
    return None if first is not None and kt.is_binary(first) else BUSY


BulkHit = tuple[int, bytes, bytes, int]  # dbidx, key, value, xt (Unix s, or KT's "never")


def _bulk_fetch(r: Reader, dbkey: tuple[int, bytes]) -> BulkHit | None:
    dbidx, key = dbkey
    if dbidx != 0:
        return None  # KT skips unknown databases silently
    v = r.get(key) if 1 <= len(key) <= MAX_KEY else None
    return None if v is None else (dbidx, key, v.value, ttl.kt_xt(v.expires_us))


def _bulk_records(hits: list[BulkHit]) -> bytes:
    pack = kt.GET_REPLY_REC.pack
    parts: list[bytes] = []
    for dbidx, key, value, xt in hits:
        parts += (pack(dbidx, len(key), len(value), xt), key, value)
    return b"".join(parts)


#: A binary get_bulk's reply, a piece at a time when big (`reads.replystream`).
BULK_SPEC: replystream.Spec[tuple[int, bytes], BulkHit] = replystream.Spec(
    fetch=_bulk_fetch,
    size=lambda hit: len(hit[2]),
    encode=_bulk_records,
    head=kt.get_bulk_reply_head,
    tail=b"",
    max_bytes=MAX_BULK_BYTES,
    slice_keys=BULK_SLICE,
)

NO_RECORD = b"DB: 7: no record: no record"
NO_PERMISSION = b"DB: 4: no permission: permission denied (read-only Mercury node)"
WRITE_PROCEDURES = frozenset(
    b"set add replace append increment increment_double cas remove seize set_bulk "
    b"remove_bulk clear synchronize vacuum cur_set_value cur_remove cur_seize "
    b"tune_replication ulog_remove".split()
)


class KtHandler:
    """Answers KT requests from `store`. One per listener; keeps KT's `cnt_*` counters."""

    def __init__(
        self,
        store: Store,
        *,
        point_only: bool = False,
        connections: Callable[[], int] = lambda: 0,
        db_aliases: tuple[bytes, ...] = (),
    ) -> None:
        self.store = store
        self.point_only = point_only
        self.db_name = os.path.basename(os.path.normpath(store.path)).encode()
        #: Other database names clients use for database 0 (`--kt-db-alias`).
        self.db_aliases = frozenset(db_aliases)
        self.connections = connections
        self.started = time.time()
        self.cnt_get = 0
        self.cnt_get_misses = 0
        self.cnt_misc = 0
        self._date = (0, "")

    # --- connection step -------------------------------------------------------------

    def session(self) -> KtSession:
        """A new connection's state."""
        return KtSession(self)

    def step(self, buf: bytearray) -> tuple[bytes, bool]:
        """Answer every complete request in `buf` at once (tests and tools; a listener runs
        a `KtSession` in slices instead)."""
        return drain(self.session().run(buf))

    def _http_date(self) -> str:
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, kt.http_date(now))
        return self._date[1]

    # --- binary ----------------------------------------------------------------------

    def handle_binary(self, req: kt.BinaryRequest) -> bytes:
        """Reply bytes of a binary request (empty when the client asked for none)."""
        return drain_value(self.binary_slices(req))

    def binary_slices(self, req: kt.BinaryRequest) -> Generator[bytes, None, bytes]:
        """A binary request in slices: yields b"" between slices, returns the reply."""
        if req.magic != kt.MAGIC_GET_BULK:
            # set/remove_bulk and play_script are writes or scripts; replication is not
            # offered by this listener (Mercury replicates with its own protocol).
            self.cnt_misc += 1
            return b"" if req.no_reply else kt.BINARY_ERROR
        t0 = time.perf_counter()
        keys = req.keys
        if keyspaces.outside_message(k for _db, k in keys) is not None:
            return kt.BINARY_ERROR  # a filtered replica's key outside: the only refusal here
        got = yield from replystream.collect(self.store, keys, BULK_SPEC)
        if isinstance(got, replystream.TooLarge):
            READ_ERRORS.labels("kt_get_bulk", "too_large").inc()
            return kt.BINARY_ERROR
        if isinstance(got, replystream.Corrupt):
            READ_ERRORS.labels("kt_get_bulk", "crc").inc()
            return kt.BINARY_ERROR
        READ_SECONDS.labels("kt_get_bulk").observe(time.perf_counter() - t0)
        if isinstance(got, replystream.Small):
            self._count_bulk(keys, [h[1] for h in got.hits])
            return kt.get_bulk_reply_head(len(got.hits)) + _bulk_records(got.hits)
        # Too big to hold: yielded in pieces as the client takes them (the reply is then
        # all in the yields; `drain_value` joins them for callers without a connection).
        # Counted once it can no longer be cut: a cut reply answered no hits.
        hit_keys = [keys[i][1] for i in got.hit_at]
        yield from replystream.stream(
            self.store, keys, got, BULK_SPEC, lambda: self._count_bulk(keys, hit_keys)
        )
        return b""

    def _count_bulk(self, keys: list[tuple[int, bytes]], hit_keys: list[bytes]) -> None:
        for k in hit_keys:
            readstats.note_read(k)
        self.cnt_get += len(keys)
        self.cnt_get_misses += len(keys) - len(hit_keys)

    # --- HTTP ------------------------------------------------------------------------

    def handle_http(self, req: kt.HttpRequest) -> tuple[bytes, bool]:
        """(reply bytes, keep the connection open) of one HTTP request."""
        gen = self.http_slices(req)
        parts: list[bytes] = []  # a reply given in pieces (a big TSV-RPC one)
        while True:
            try:
                chunk = next(gen)
            except StopIteration as stop:
                reply, keep = stop.value
                return b"".join(parts) + bytes(reply), bool(keep)
            if chunk:
                parts.append(bytes(chunk))

    def http_slices(self, req: kt.HttpRequest) -> Generator[bytes, None, tuple[bytes, bool]]:
        """One HTTP request in slices (yields b"" between them); returns (reply, keep)."""
        keep = req.keep_alive
        path = req.path
        if path.startswith(b"/rpc/"):
            status, out = yield from self._rpc(kt.url_decode(path[5:]), req)
            pieces, ctype = yield from kt.tsv_pieces(out)
            head = kt.encode_http_response(
                status,
                headers=[("Content-Type", ctype)],
                keep_alive=keep,
                head=True,
                content_length=sum(map(len, pieces)),
                date=self._http_date(),
            )
            if len(pieces) == 1:
                return head + pieces[0], keep
            # A big reply: handed on a piece at a time, as the client takes it (the
            # connection writes at most `TURN_BYTES` a turn, and waits when it lags).
            yield head
            yield from pieces
            return b"", keep
        return self._rest(req, keep), keep

    def _rest(self, req: kt.HttpRequest, keep: bool) -> bytes:
        date = self._http_date()
        if req.method not in ("GET", "HEAD", "PUT", "DELETE"):
            return kt.encode_http_response(501, keep_alive=keep, date=date)
        try:
            db, key = kt.rest_key(req.path)
        except ReadProtocolError as err:
            return kt.bad_path(err, keep, date)
        if db is not None and not self._db_ok(db):
            return kt.encode_http_response(
                400,
                b"no such database\n",
                headers=[("Content-Type", "text/plain")],
                keep_alive=keep,
                date=date,
            )
        if req.method in ("PUT", "DELETE"):
            self.cnt_misc += 1
            return kt.encode_http_response(
                500, headers=[("X-Kt-Error", NO_PERMISSION.decode())], keep_alive=keep, date=date
            )
        t0 = time.perf_counter()
        head = req.method == "HEAD"
        try:
            v = self.store.get(key) if 1 <= len(key) <= MAX_KEY else None
        except CRCError as err:
            READ_ERRORS.labels("kt_rest_get", "crc").inc()
            return kt.encode_http_response(
                500,
                headers=[("X-Kt-Error", f"DB: 5: broken file: {err.message}")],
                keep_alive=keep,
                date=date,
            )
        self.cnt_get += 1
        outside = keyspaces.outside_message([key]) if v is None else None
        if outside is not None:  # a filtered replica does not hold it: a 404 would lie
            self.cnt_get_misses += 1
            reply = kt.encode_http_response(
                421, headers=[("X-Kt-Error", outside)], keep_alive=keep, date=date
            )
        elif v is None:
            self.cnt_get_misses += 1
            reply = kt.encode_http_response(
                404, headers=[("X-Kt-Error", NO_RECORD.decode())], keep_alive=keep, date=date
            )
        else:
            readstats.note_read(key)
            # KT names a record's expiry in X-Kt-Xt (an HTTP date), and only when it has one
            xt = [("X-Kt-Xt", ttl.http_date(v.expires_us))] if v.expires_us else []
            reply = kt.encode_http_response(
                200,
                v.value,
                headers=xt,
                keep_alive=keep,
                head=head,
                content_length=len(v.value),
                date=date,
            )
        READ_SECONDS.labels("kt_rest_get").observe(time.perf_counter() - t0)
        return reply

    def _db_ok(self, db: bytes) -> bool:
        return db in (b"0", self.db_name) or db in self.db_aliases

    def _rpc(
        self, proc: bytes, req: kt.HttpRequest
    ) -> Generator[bytes, None, tuple[int, dict[bytes, bytes]]]:
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
        t0 = time.perf_counter()
        try:
            if proc == b"get":
                result = self._rpc_get(params, want_value=True)
            elif proc == b"check":
                result = self._rpc_get(params, want_value=False)
            elif proc == b"get_bulk":
                result = yield from self._rpc_get_bulk(params)
            elif proc == b"match_prefix":
                result = yield from self._rpc_match_prefix(params)
            elif proc == b"void":
                result = 200, {}
            elif proc == b"echo":
                result = 200, params
            elif proc == b"status":
                result = 200, self._status()
            elif proc == b"report":
                result = 200, self._report()
            elif proc == b"play_script":
                result = 501, {b"ERROR": b"the scripting extention is disabled"}
            else:
                result = 501, {b"ERROR": b"not implemented: " + proc}
        except CRCError as err:
            READ_ERRORS.labels("kt_rpc", "crc").inc()
            return 500, {b"ERROR": b"DB: 5: broken file: " + err.message.encode()}
        if result[0] != 501:
            READ_SECONDS.labels("kt_" + proc.decode()).observe(time.perf_counter() - t0)
        return result

    def _rpc_get(
        self, params: dict[bytes, bytes], *, want_value: bool
    ) -> tuple[int, dict[bytes, bytes]]:
        key = params.get(b"key")
        if key is None:
            return 400, {b"ERROR": b"invalid parameters"}
        v = self.store.get(key) if 1 <= len(key) <= MAX_KEY else None
        self.cnt_get += 1
        outside = keyspaces.outside_message([key]) if v is None else None
        if outside is not None:  # a filtered replica does not hold it: 450 would lie
            self.cnt_get_misses += 1
            return 421, {b"ERROR": outside.encode()}
        if v is None:
            self.cnt_get_misses += 1
            return 450, {b"ERROR": NO_RECORD}
        readstats.note_read(key)
        out = {b"value": v.value} if want_value else {b"vsiz": b"%d" % len(v.value)}
        if v.expires_us:  # KT's xt column (Unix seconds), only for a record that expires
            out[b"xt"] = b"%d" % ttl.kt_xt(v.expires_us)
        return 200, out

    def _rpc_get_bulk(
        self, params: dict[bytes, bytes]
    ) -> Generator[bytes, None, tuple[int, dict[bytes, bytes]]]:
        # Time-bounded slices (`core/slices.py`): other connections, and the gateway's
        # writes on the root, run between them; each slice reads in its own transaction.
        clock = SliceClock()
        names = list(params)
        keys: list[bytes] = []
        for start in range(0, len(names), BULK_SLICE):
            if clock.due():
                yield b""
                clock.start()
            keys.extend(k[1:] for k in names[start : start + BULK_SLICE] if k.startswith(b"_"))
        outside = keyspaces.outside_message(keys)
        if outside is not None:  # a filtered replica's: its misses there would lie
            return 421, {b"ERROR": outside.encode()}
        out: dict[bytes, bytes] = {}
        size = 0
        start = 0
        while start < len(keys):
            if clock.due():
                yield b""
                clock.start()
            with self.store.reader() as r:
                while start < len(keys) and not clock.due():
                    for k in keys[start : start + CHUNK]:
                        v = r.get(k) if 1 <= len(k) <= MAX_KEY else None
                        if v is not None:
                            readstats.note_read(k)
                            out[b"_" + k] = v.value
                            size += len(v.value)
                            if size > MAX_BULK_BYTES:
                                return 400, {
                                    b"ERROR": b"invalid parameters: the values exceed %d "
                                    b"bytes; ask for fewer keys" % MAX_BULK_BYTES
                                }
                    start += CHUNK
        self.cnt_get += len(keys)
        self.cnt_get_misses += len(keys) - len(out)
        out[b"num"] = b"%d" % len(out)
        return 200, out

    def _rpc_match_prefix(
        self, params: dict[bytes, bytes]
    ) -> Generator[bytes, None, tuple[int, dict[bytes, bytes]]]:
        if self.point_only:
            return 501, {
                b"ERROR": b"not implemented: match_prefix on the root "
                b"(range reads are served by consumer nodes)"
            }
        prefix = params.get(b"prefix")
        if prefix is None:
            return 400, {b"ERROR": b"invalid parameters"}
        if keyspaces.held() is not None and not keyspaces.holds_prefix(prefix):
            return 421, {b"ERROR": b"prefix outside this filtered replica's keyspaces"}
        try:
            want = int(params.get(b"max", b"-1"))
        except ValueError:
            return 400, {b"ERROR": b"invalid parameters"}
        bound = MAX_MATCH if want < 0 else min(want, MAX_MATCH)
        spec = make_spec(prefix=prefix) if prefix else make_spec()
        out: dict[bytes, bytes] = {}
        after: bytes | None = None
        while len(out) < bound:
            if after is not None:
                yield b""  # other connections run before the next chunk
            with self.store.reader() as r:
                items, more = read_page(
                    r, spec, after, min(MATCH_CHUNK, bound - len(out)), keys_only=True
                )
            for k, _ in items:
                out[b"_" + k] = b"%d" % len(out)
            if not more or not items:
                break
            after = items[-1][0]
        else:
            if want < 0:
                with self.store.reader() as r:
                    extra, _ = read_page(r, spec, after, 1, keys_only=True)
                if extra:
                    return 400, {
                        b"ERROR": b"invalid parameters: more than %d keys match; "
                        b"pass max or page with GET /v1/range" % MAX_MATCH
                    }
        out[b"num"] = b"%d" % len(out)
        return 200, out

    def _status(self) -> dict[bytes, bytes]:
        st = self.store.stat()
        return {
            b"count": b"%d" % st["entries_data"],
            b"size": b"%d" % st["file_size"],
            b"path": self.store.path.encode(),
            b"type": b"mercury-lmdb",
        }

    def _report(self) -> dict[bytes, bytes]:
        st = self.store.stat()
        now = time.time()
        count, size = st["entries_data"], st["file_size"]
        return {
            b"conf_kt_version": b"1.0.0 (Mercury)",
            b"conf_kt_features": b"(read-only Mercury node)",
            b"conf_os_name": os.uname().sysname.encode(),
            b"db_total_count": b"%d" % count,
            b"db_total_size": b"%d" % size,
            b"db_0": b"count=%d size=%d path=%s" % (count, size, self.store.path.encode()),
            b"serv_conn_count": b"%d" % self.connections(),
            b"serv_task_count": b"0",
            b"serv_thread_count": b"1",
            b"serv_current_time": b"%d" % int(now),
            b"serv_running_term": b"%.6f" % (now - self.started),
            b"serv_proc_id": b"%d" % os.getpid(),
            b"cnt_set": b"0",
            b"cnt_set_misses": b"0",
            b"cnt_remove": b"0",
            b"cnt_remove_misses": b"0",
            b"cnt_get": b"%d" % self.cnt_get,
            b"cnt_get_misses": b"%d" % self.cnt_get_misses,
            b"cnt_script": b"0",
            b"cnt_misc": b"%d" % self.cnt_misc,
        }


class KtSession:
    """One KT connection: its incremental binary and HTTP parsers and the request loop."""

    def __init__(self, handler: KtHandler) -> None:
        self.h = handler
        self.parser = kt.BinaryParser()
        self.http = kt.HttpParser()

    def phase(self, buf: bytearray) -> str:
        """Where the partial request in `buf` is (see `net.tcp.Session`)."""
        if self.parser.busy:
            return "body"
        if kt.is_binary(buf[0]):
            return kt.binary_phase(buf)
        # the HTTP parser has seen all of `buf` (it runs on every segment received)
        return "body" if self.http.head_done else "header"

    def run(self, buf: bytearray) -> Run:
        """Answer the complete requests at the front of `buf` in slices."""
        h = self.h
        while buf:
            try:
                if self.parser.busy or kt.is_binary(buf[0]):
                    got_b = self.parser.feed(buf)
                    if got_b is None:
                        if self.parser.starved:
                            return False
                        yield b""  # a slice of a big request parsed
                        continue
                    breq, n = got_b
                    del buf[:n]
                    reply = yield from h.binary_slices(breq)
                    yield reply
                    continue
                got_h = self.http.feed(buf)
                if got_h is None:
                    return False
                hreq, n = got_h
                del buf[:n]
                reply, keep = yield from h.http_slices(hreq)
                yield reply
                if not keep:
                    return True
            except ReadProtocolError as err:
                self.parser.reset()
                self.http.reset()
                READ_ERRORS.labels("kt", "protocol").inc()
                buf.clear()
                if err.status is not None:
                    body = kt.error_body(err.status, err.message)
                    yield kt.encode_http_response(
                        err.status,
                        body,
                        headers=[("Content-Type", "text/plain")],
                        keep_alive=False,
                        date=h._http_date(),
                    )
                return True
        return False


def drain_value(gen: Generator[bytes, None, bytes]) -> bytes:
    """Run a sliced computation to its end: what it yielded (pieces of a big reply; b""
    between slices) and then returned."""
    out: list[bytes] = []
    while True:
        try:
            out.append(next(gen))
        except StopIteration as stop:
            out.append(bytes(stop.value))
            return b"".join(out)


def kt_service(
    store: Store,
    host: str,
    port: int,
    *,
    point_only: bool = False,
    limits: ListenerLimits | None = None,
    db_aliases: tuple[bytes, ...] = (),
) -> TcpService:
    """The KT listener as a `Service` (all connections share one handler and its counters)."""
    holder: list[TcpService] = []
    handler = KtHandler(
        store,
        point_only=point_only,
        connections=lambda: holder[0].connections,
        db_aliases=db_aliases,
    )
    svc = TcpService("kt", host, port, handler.session, limits=limits, busy_reply_to=busy_reply_to)
    holder.append(svc)
    return svc
