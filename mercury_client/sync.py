"""`Client`: the blocking Mercury SDK over httpx (see docs/client.md).

Writes go to the root (`url`); reads (`get`, `range`, `watch`) to `read_url` when given
(a replica or consumer node), else to the root. Every write carries an Idempotency-Key
(one per logical write, the same on each retry), so a retry after a cut connection or a
429/503 never writes twice.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from mercury_client import calls, wire
from mercury_client.calls import READ, Call
from mercury_client.errors import Gone, TooLarge, Unavailable
from mercury_client.retry import DEFAULT_POLICY, MOVE_ON, RetryPolicy, retryable


class Client:
    """A connection pool to one root (writes) and optionally one read node.

    `token`: the producer's bearer token (writes, and reads on the root); `read_token`:
    the bearer sent to `read_url` (none by default, so a producer token never leaves for
    another node). `verify`: True (system CAs), False, or a CA bundle path; `cert`: a
    client certificate path, or (cert, key) paths. `timeout`: seconds per network wait.
    `url`: the root's URL, or every candidate's of an HA group (a list, or one string
    comma-separated): a call that meets a refused connection or a 502/503/504 moves on to
    the next at once, and the next calls start at the one that answered (a standby's 307
    names the leader). `retries`: a `RetryPolicy`, or tries in all; the default
    (`DEFAULT_POLICY`) tries at least 6 times and on until its waits reach
    `DEFAULT_BUDGET_S` (14 s: one HA failover of the default lease, twice over).
    `idempotent`: send an Idempotency-Key with every write (on by default; without it a
    write is retried only when the connection was refused, i.e. when the request surely
    never arrived).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        token: str | None = None,
        *,
        read_url: str | None = None,
        read_token: str | None = None,
        verify: bool | str = True,
        cert: str | tuple[str, str] | None = None,
        timeout: float = 30.0,
        retries: int | RetryPolicy = DEFAULT_POLICY,
        idempotent: bool = True,
        batch_ops: int = wire.DEFAULT_BATCH_OPS,
        batch_bytes: int = wire.DEFAULT_BATCH_BYTES,
        rand: Callable[[], float] = random.random,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.policy = retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries)
        self.idempotent = idempotent
        self.batch_ops = batch_ops
        self.batch_bytes = batch_bytes
        self._rand = rand
        self._sleep = sleep
        tls = calls.ssl_context(verify, cert)
        auth = calls.bearer(token)
        urls = calls.node_urls(url)
        #: where writes go (and reads without `read_url`): every URL given, the leader first
        self._writes = calls.Route(urls)
        # A dead candidate's host may not refuse: give up connecting to it well before the
        # read timeout (the next URL is tried at once).
        limits = httpx.Timeout(timeout, connect=min(timeout, calls.CONNECT_TIMEOUT_S))
        self._write = httpx.Client(base_url=urls[0], headers=auth, verify=tls, timeout=limits)
        self._reads = self._writes if read_url is None else calls.Route([read_url.rstrip("/")])
        if read_url is None:
            self._read = self._write
        else:
            rauth = calls.bearer(read_token, "read_token")
            self._read = httpx.Client(base_url=read_url, headers=rauth, verify=tls, timeout=timeout)

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        self._write.close()
        if self._read is not self._write:
            self._read.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the one retry loop ---------------------------------------------------------------

    def _stream_url(self, call: Call) -> str:
        """Where a streamed read goes: the read node, or the write node that answered last."""
        return self._reads.base() + call.path

    def _idem(self, idempotency_key: str | None) -> str | None:
        if idempotency_key is not None:
            return idempotency_key
        return calls.new_idempotency_key() if self.idempotent else None

    def _send(self, call: Call, *, safe: bool = True, ok404: bool = False) -> httpx.Response:
        """Send `call`, retrying what may be retried; the answer (2xx, or 404 when
        `ok404`) or the typed exception. `safe`: repeating the request cannot do harm
        (reads, writes with an Idempotency-Key)."""
        http, route = (
            (self._read, self._reads) if call.node == READ else (self._write, self._writes)
        )
        attempt = redirects = 0
        waited = 0.0
        target: str | None = None  # a redirect's Location, else the route's URL
        while True:
            url = target if target is not None else route.base() + call.path
            try:
                r = http.request(call.method, url, headers=call.headers, content=call.content)
            except httpx.TransportError as err:
                if not safe and not isinstance(err, httpx.ConnectError):
                    raise _unavailable(err) from err
                failure: Exception = _unavailable(err)
                failure.__cause__ = err
                headers: Mapping[str, str] = {}
                move_on = True
            else:
                if calls.success(r, ok404):
                    route.answered(str(r.request.url))
                    return r
                # An HA standby sends a write to its leader: the same request, once more
                # (the standby applied nothing).
                location = calls.redirect(r) if redirects < calls.MAX_REDIRECTS else None
                if location is not None:
                    target, redirects = location, redirects + 1
                    continue
                if not retryable(r.status_code, safe):
                    raise calls.error(r)
                failure, headers, move_on = calls.error(r), r.headers, r.status_code in MOVE_ON
            # A retry asks a node again: after a failover it names the new leader.
            target, redirects = None, 0
            if move_on and not route.failed():
                continue  # another URL not tried this round: at once
            wait = self.policy.wait(attempt, headers, self._rand, waited)
            if wait is None:
                raise failure
            self._sleep(wait)
            waited += wait
            attempt += 1
            route.waited()

    # --- keys -----------------------------------------------------------------------------

    def put(
        self,
        key: wire.Key,
        value: str | bytes,
        *,
        if_seq: int | None = None,
        if_absent: bool = False,
        idempotency_key: str | None = None,
        ttl: calls.Ttl | None = None,
        expires_at: str | datetime | None = None,
    ) -> wire.WriteResult:
        """Write one key; answered after the root's durable commit. `if_seq`: only if the
        key's current seq is this one; `if_absent`: only if the key is absent (otherwise
        `PreconditionFailed`, carrying the key's `current_seq`). `ttl` (``"90s"``, ``"5m"``,
        seconds, a timedelta) or `expires_at` (RFC 3339, an aware datetime): the key
        expires then, logged by the root (1 s to one year ahead, else `BadRequest`); a put
        without either clears the key's deadline."""
        idem = self._idem(idempotency_key)
        query = calls.expiry_query(ttl, expires_at)
        call = calls.put(key, value, idem, calls.condition(if_seq, if_absent), query)
        r = self._send(call, safe=idem is not None)
        return calls.write_result(r)

    def delete(
        self,
        key: wire.Key,
        *,
        if_seq: int | None = None,
        idempotency_key: str | None = None,
    ) -> wire.WriteResult:
        """Delete one key (status "absent" when it was not there); `if_seq` as for `put`."""
        idem = self._idem(idempotency_key)
        call = calls.delete(key, idem, calls.condition(if_seq, False))
        r = self._send(call, safe=idem is not None)
        return calls.write_result(r)

    def delete_prefix(
        self, prefix: wire.Key, *, idempotency_key: str | None = None
    ) -> wire.BatchResult:
        """Delete every key under `prefix` (inside the producer's keyspaces): one
        ``DELETE /v1/kv?prefix=P`` per batch's worth, repeated while the node says keys
        remain (``more``). Not atomic: each request commits on its own. A request that
        deleted nothing while keys remain (the open batch holds the keyspace's delete
        guard) is repeated after a batch window, `PREFIX_IDLE_TRIES` times at most."""
        total = wire.BatchResult()
        idle = 0
        n = 0
        while True:
            n += 1
            base = self._idem(idempotency_key)
            idem = f"{base}:{n}" if idempotency_key is not None and base else base
            r = self._send(calls.delete_prefix(prefix, idem), safe=idem is not None)
            doc = r.json()
            total.add(doc, calls.replayed(r))
            if not doc.get("more"):
                return total
            idle = idle + 1 if not doc.get("deleted") else 0
            if idle >= calls.PREFIX_IDLE_TRIES:
                raise Unavailable(
                    0,
                    "Prefix delete stalled",
                    f"{calls.PREFIX_IDLE_TRIES} requests in a row deleted nothing while keys "
                    "remain (the keyspace's max_deletes_per_batch guard is spent)",
                )
            if not doc.get("deleted"):
                self._sleep(calls.PREFIX_PAUSE_S)

    def get(self, key: wire.Key) -> bytes | None:
        """The value of `key`, or None when it is absent (a 404 of type no-such-key); a
        404 for a path no route serves (a wrong base URL) raises `NoSuchRoute`."""
        r = self._send(calls.get(key), ok404=True)
        return None if r.status_code == 404 else r.content  # 404 here: no such key

    def get_with_seq(self, key: wire.Key) -> wire.Versioned | None:
        """The value of `key` and the seq of its last change (None when absent): read,
        then write back with ``put(key, new, if_seq=v.seq)`` for a compare-and-set."""
        r = self._send(calls.get(key), ok404=True)
        return None if r.status_code == 404 else calls.versioned(r)

    def get_many(self, keys: Iterable[wire.Key]) -> dict[bytes, bytes | None]:
        """The values of many keys (None for absent ones), from `read_url`: one
        ``POST /v1/get_bulk`` per 10,000 keys. Keys come back as bytes."""
        ks = list(dict.fromkeys(wire.as_bytes(k) for k in keys))
        out: dict[bytes, bytes | None] = {}
        for i in range(0, len(ks), calls.BULK_KEYS):
            part = ks[i : i + calls.BULK_KEYS]
            r = self._send(calls.get_bulk(part))
            out.update(calls.bulk_values(part, r.json()))
        return out

    def batch(
        self,
        ops: Iterable[Sequence[Any]],
        *,
        idempotency_key: str | None = None,
        split: bool = True,
        on_done: Callable[[int], None] | None = None,
    ) -> wire.BatchResult:
        """Apply ``("set", key, value)`` / ``("delete", key)`` ops in order.

        Ops are sent in requests of at most `batch_ops` ops and `batch_bytes` key + value
        bytes; a 413 naming the largest admissible batch (``max_ops``/``max_bytes``) re-cuts
        the rest to fit. Each request is atomic on the root; a batch that takes several is
        not (pieces apply in order; on an error the earlier ones stay applied). With
        ``split=False`` a batch that does not fit one request raises `TooLarge` instead.
        The limits a 413 named hold for the client's later batches too (`batch_ops`,
        `batch_bytes`), which are cut to them from the start. `on_done(n)` is called as
        each request is acknowledged, with its number of ops (progress reports).
        """
        wops = [wire.encode_op(op) for op in ops]
        idem = self._idem(idempotency_key)
        plan = wire.BatchPlan(wops, idem or "", self.batch_ops, self.batch_bytes)
        if not split and len(plan.pending) > 1:
            raise TooLarge(
                413,
                "Content Too Large",
                f"{len(wops)} ops do not fit one request ({self.batch_ops} ops, "
                f"{self.batch_bytes} bytes)",
            )
        total = wire.BatchResult()
        while (piece := plan.next()) is not None:
            call = calls.batch(plan.body(piece), plan.key(piece) if idem else None)
            try:
                r = self._send(call, safe=idem is not None)
            except TooLarge as err:
                if not split or not plan.too_large(err.max_ops, err.max_bytes):
                    raise
                if err.max_ops is not None or err.max_bytes is not None:
                    # the node's bound (e.g. what a producer's rate quota can ever admit)
                    # holds for the next batches too: none pays its 413 again
                    self.batch_ops, self.batch_bytes = plan.max_ops, plan.max_bytes
                continue
            total.add(r.json(), calls.replayed(r))
            plan.done()
            if on_done is not None:
                on_done(piece[1] - piece[0])
        return total

    # --- reads from a replica -------------------------------------------------------------

    def applied_seq(self) -> int:
        """The log seq the read node has applied (``GET /v1/status``)."""
        r = self._send(Call(READ, "GET", "/v1/status"))
        return int(r.json()["seq"])

    def wait_applied(self, seq: int, timeout: float = 30.0) -> None:
        """Wait until the read node has applied `seq` (e.g. a write's `seq`), so a read
        there sees that write; `Unavailable` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self.applied_seq() < seq:
            if time.monotonic() > deadline:
                raise Unavailable(0, "Lagging", f"the read node has not applied seq {seq}")
            time.sleep(0.02)

    def range(
        self,
        prefix: wire.Key | None = None,
        *,
        start: wire.Key | None = None,
        end: wire.Key | None = None,
        keys_only: bool = False,
        page_size: int = 1000,
        stream: bool = False,
    ) -> Iterator[wire.Item]:
        """Every key of a prefix, or of ``[start, end)``, in key order (from `read_url`).

        Paged by default: one request per `page_size` keys, each retried on its own, so a
        dropped connection resumes at the page it was reading. ``stream=True`` reads the
        whole range as one NDJSON stream (fewer round trips; a dropped stream raises
        `Unavailable`)."""
        if stream:
            yield from self._range_stream(wire.range_query(prefix, start, end, keys_only=keys_only))
            return
        cursor: str | None = None
        while True:
            q = wire.range_query(
                prefix, start, end, keys_only=keys_only, limit=page_size, cursor=cursor
            )
            doc = self._send(calls.range_page(q)).json()
            for it in doc["items"]:
                yield wire.item(it)
            cursor = doc.get("next_cursor")
            if not cursor:
                return

    def _range_stream(self, query: str) -> Iterator[wire.Item]:
        call = calls.range_stream(query)
        try:
            with self._read.stream(
                "GET", self._reads.base() + call.path, headers=call.headers
            ) as r:
                if not calls.success(r, False):  # a redirect too: its body is no stream
                    r.read()
                    raise calls.error(r)
                for line in r.iter_lines():
                    if line.strip():
                        yield calls.range_item(calls.ndjson(line))
        except httpx.TransportError as err:
            raise _unavailable(err) from err

    def watch(
        self, prefix: wire.Key, *, from_seq: int | None = None
    ) -> Generator[wire.Change, None, None]:
        """Changes under `prefix` as they happen (NDJSON from ``GET /v1/watch`` on
        `read_url`): from now on by default, or from log seq `from_seq` (inclusive). A
        dropped connection is re-opened where the stream was (the last change or heartbeat
        seen), without repeating or missing a change; `Gone` when that seq is no longer
        retained (`follow` recovers from it by itself). Endless: stop iterating (or close
        the generator) to end it."""
        for c in self._watch(prefix, wire.Resume(from_seq)):
            if c is not None:
                yield c

    def _watch(
        self, prefix: wire.Key, resume: wire.Resume
    ) -> Generator[wire.Change | None, None, None]:
        """The watch loop: each change to deliver, and None after each other line (so a
        caller can look at `resume` on heartbeats)."""
        attempt = 0
        while True:
            call = calls.watch(prefix, resume.restart())
            try:
                with self._read.stream(
                    "GET", self._reads.base() + call.path, headers=call.headers
                ) as r:
                    if not calls.success(r, False):  # a redirect too: its body is no stream
                        r.read()
                        wait = (
                            self.policy.wait(attempt, r.headers, self._rand)
                            if retryable(r.status_code, True)
                            else None
                        )
                        if wait is None:
                            raise calls.error(r)
                    else:
                        wait = None
                        for line in r.iter_lines():
                            if not line.strip():
                                continue
                            attempt = 0  # the stream is alive: failures count afresh
                            yield calls.watch_line(line, resume)
                        wait = self.policy.wait(attempt, {}, self._rand)
            except httpx.TransportError as err:
                wait = self.policy.wait(attempt, {}, self._rand)
                if wait is None:
                    raise _unavailable(err) from err
            if wait is None:
                raise Unavailable(0, "Watch ended", "the node closed the watch stream")
            self._sleep(wait)
            attempt += 1

    def snapshot(self, prefix: wire.Key, *, page_size: int = 1000) -> wire.Snapshot:
        """Every key under `prefix` as it was at one log seq of the read node, without
        holding a read transaction open for the whole read: note the node's seq S, read
        the range page by page (each page a little later), note the seq E, then fold the
        changes of (S, E] from a watch over the pages — the result is the prefix exactly
        at E (`Snapshot.seq`). The pages wait in a temporary file (memory up to 8 MiB).
        `Gone` only when the node's log retention is shorter than the read took, three
        times in a row."""
        err: Gone | None = None
        for _ in range(wire.SNAPSHOT_TRIES):
            start = self.applied_seq()
            # closed by the snapshot's reader (unpack_items), or below on failure
            spool = tempfile.SpooledTemporaryFile(max_size=wire.SPOOL_MEMORY)  # noqa: SIM115
            try:
                for it in self.range(prefix, page_size=page_size):
                    spool.write(wire.pack_item(it))
                end = self.applied_seq()
                overlay = wire.Overlay(end)
                if end > start:
                    resume = wire.Resume(start + 1)
                    with contextlib.closing(self._watch(prefix, resume)) as changes:
                        for c in changes:
                            if c is not None:
                                overlay.add(c)
                            if resume.complete_through() >= end:
                                break
            except Gone as gone:
                spool.close()
                err = gone
                continue
            except BaseException:
                spool.close()
                raise
            spool.seek(0)
            return wire.Snapshot(end, overlay.merge(wire.unpack_items(spool)))  # type: ignore[arg-type]
        assert err is not None
        raise err

    def follow(
        self, prefix: wire.Key, *, from_seq: int | None = None
    ) -> Generator[wire.Snapshot | wire.Change, None, None]:
        """A consumer's mirror of `prefix`: a `Snapshot` first (unless `from_seq` says
        where the caller's copy stands), then every change after it; when the watch's
        position is no longer retained (a long outage, 410), a new `Snapshot` to replace
        the copy, and the changes after that one — `Gone` only if `snapshot` itself
        cannot finish (see there). Read each snapshot's items before the next event."""
        if from_seq is None:
            snap = self.snapshot(prefix)
            yield snap
            from_seq = snap.seq + 1
        while True:
            resume = wire.Resume(from_seq)
            try:
                for c in self._watch(prefix, resume):
                    if c is not None:
                        yield c
            except Gone:
                snap = self.snapshot(prefix)
                yield snap
                from_seq = snap.seq + 1


def _unavailable(err: httpx.TransportError) -> Unavailable:
    return calls.unavailable(err)
