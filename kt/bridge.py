"""`mercury kt-bridge`: follow a running Kyoto Tycoon server's update log as a replication
slave and write every change through the gateway (SDK batches), so producers that write to
KT keep working unchanged while Mercury serves the reads.

Resuming without duplicates or gaps: the bridge keeps a cursor in a small state file — the
KT timestamp up to which every change is acknowledged by the gateway — and asks the master
for the entries after it. Before a batch is sent, its cut (last timestamp) and its
Idempotency-Key (``kt-bridge-<first ts>-<last ts>``, derived from KT's timestamps only) are
written to the state file; after a crash the same entries are cut into the same batch and
sent with the same key, so the gateway answers the replay with the first answer instead
of applying it twice. A KT ``clear`` deletes every key under the bridge's prefix, listed
from a read node (`--read-url`); without one the bridge stops at the clear.

A KT key Mercury cannot hold (longer than 500 bytes with the prefix) stops the bridge at
its update-log entry: the entry stays in KT's log whatever happens to the key in KT since,
so a restarted bridge meets it again. `--skip-refused FILE` is the way past: each such
change is recorded in FILE (one JSON line: timestamp, database, operation, the key in
base64, its length, the reason) durably before the cursor can move past it, and every
other change of the log is written as usual; a replay after a crash records it once.

`--import` copies an existing KT database once (RPC cursor `cur_jump`/`cur_get`), after
recording in the state file a cursor one second before the import began (KT's own clock),
so a bridge started afterwards replays every change the import may have missed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import Gauge

from core import failpoints, ttl
from core.errors import MercuryError
from kt import protocol as kt_protocol
from kt import ulog as kt_ulog
from mercury_client import (
    BatchResult,
    Client,
    MercuryClientError,
    RateLimited,
    ServerError,
    Unavailable,
)

log = logging.getLogger("kt.bridge")

#: Mercury's key length bounds (store/format.py's MAX_KEY; the SDK imports no server code).
MAX_KEY = 500
#: The master closes a slave that stays silent; answering each NOP keeps it open. Without
#: any byte for this long the connection is considered dead and reopened.
DEAD_AFTER_S = 30.0
#: Pause before reconnecting after the master went away.
RECONNECT_S = 1.0
#: While the master stays away, how often the bridge says it still waits for it.
WAITING_LOG_S = 60.0
#: Pause before sending a batch again after the root did not take it.
RETRY_S = 2.0


#: When the bridge last heard its KT server (an entry, or the NOP keep-alive an idle
#: master sends): the "KT bridge stopped" alert (deploy/prometheus) fires when
#: it grows old, or when the bridge's `--metrics-listen` stops answering.
LAST_CONTACT = Gauge(
    "mercury_kt_bridge_last_contact_timestamp_seconds",
    "When the KT bridge last received bytes from its KT server (seconds since the epoch)",
)


class KtBridgeError(MercuryError):
    """The bridge cannot go on without an operator (a key Mercury cannot hold, a refused
    replication, a clear without a read node...)."""


# --- the state file ---------------------------------------------------------------------


@dataclass
class BridgeState:
    """`ts`: every change up to this KT timestamp is acknowledged. `pending`: the batch
    being sent (``{"last_ts", "key"}``), replayed identically after a crash."""

    path: Path
    ts: int = 0
    pending: dict[str, Any] | None = None

    @classmethod
    def load(cls, path: Path) -> BridgeState:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as err:
            raise KtBridgeError(f"cannot read the bridge state {path}: {err}") from err
        return cls(path, int(doc.get("ts", 0)), doc.get("pending"))

    def save(self) -> None:
        """Write atomically and durably (temporary file, fsync, rename)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = json.dumps({"ts": self.ts, "pending": self.pending}).encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


# --- mapping KT changes to Mercury ops --------------------------------------------------


@dataclass
class Options:
    """What the bridge follows and where it writes (see `mercury kt-bridge --help`)."""

    kt: tuple[str, int]
    prefix: bytes = b""
    dbid: int = 0
    sid: int = 65535
    persistent: bool = False
    window_s: float = 0.2
    batch_ops: int = 1000


class RefusedKey(KtBridgeError):
    """A KT key Mercury cannot hold (`reason` says why)."""

    def __init__(self, message: str, reason: str, hint: str) -> None:
        super().__init__(message, hint=hint)
        self.reason = reason


def mercury_key(prefix: bytes, key: bytes, ts: int) -> bytes:
    """The Mercury key of a KT key; RefusedKey when Mercury cannot hold it."""
    full = prefix + key
    if not 1 <= len(full) <= MAX_KEY:
        raise RefusedKey(
            f"KT key {key[:40]!r} (ts {ts}) makes a Mercury key of {len(full)} bytes (1-{MAX_KEY})",
            reason=f"key of {len(full)} bytes with the prefix (Mercury holds 1-{MAX_KEY})",
            hint="the entry stays in KT's update log, so changing the key in KT does not get "
            "past it: restart with --skip-refused FILE to record it there and go on "
            "(docs/kt-compat.md)",
        )
    return full


class Quarantine:
    """The changes the bridge skipped (`--skip-refused FILE`): one JSON line each, appended
    and fsynced before the cursor can move past the change; a change already in the file
    (a replay after a crash) is not recorded twice."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.skipped = 0  # recorded by this process
        self.seen: set[tuple[int, str]] = set()
        try:
            for line in path.read_text().splitlines():
                if line.strip():
                    doc = json.loads(line)
                    self.seen.add((int(doc["ts"]), str(doc["key_b64"])))
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError) as err:
            raise KtBridgeError(f"cannot read the skipped-changes file {path}: {err}") from err

    def record(self, c: kt_ulog.Change, reason: str) -> None:
        key_b64 = base64.b64encode(c.key).decode()
        if (c.ts, key_b64) in self.seen:
            return
        doc = {
            "ts": c.ts,
            "db": c.dbid,
            "op": c.kind,
            "key_b64": key_b64,
            "key_len": len(c.key),
            "reason": reason,
        }
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (json.dumps(doc) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self.seen.add((c.ts, key_b64))
        self.skipped += 1
        log.warning(
            "kt-bridge: skipped the %s of KT key %r (ts %d): %s; recorded in %s",
            c.kind,
            c.key[:40],
            c.ts,
            reason,
            self.path,
        )


def _set_op(key: bytes, value: bytes, xt: int) -> tuple[Any, ...]:
    """The batch op of a KT set: KT's expiry (`xt`, absolute seconds) carried as the key's
    deadline (`ttl.bridge_expiry`); an expiry already past deletes the key."""
    at = ttl.bridge_expiry(xt, kt_ulog.XT_NONE, ttl.now_us())
    if at == ttl.EXPIRED_NOW:
        return ("delete", key)
    if at:
        return ("set", key, value, datetime.fromtimestamp(at / 1_000_000, UTC))
    return ("set", key, value)


@dataclass
class Batch:
    """Changes collected since the last flush, with the KT timestamps they span."""

    ops: list[tuple[Any, ...]] = field(default_factory=list)
    first_ts: int = 0
    nbytes: int = 0
    started: float = 0.0

    def add(self, op: tuple[Any, ...], ts: int, size: int) -> None:
        if not self.ops:
            self.first_ts = ts
            self.started = time.monotonic()
        self.ops.append(op)
        self.nbytes += size


# --- the follower ------------------------------------------------------------------------


class Bridge:
    """Follows one KT master and applies its changes through `client` (a `Client` on the
    root, with `read_url` set when clears must be followed)."""

    def __init__(
        self,
        opts: Options,
        client: Client,
        state: BridgeState,
        *,
        can_clear: bool = False,
        stop: Callable[[], bool] = lambda: False,
        quarantine: Quarantine | None = None,
    ) -> None:
        self.o = opts
        self.quarantine = quarantine
        self.client = client
        self.state = state
        self.can_clear = can_clear
        self.stop = stop
        self.batch = Batch()
        self.seen_ts = state.ts  # every entry up to here is in `batch` or acknowledged
        self._followed = False  # this session got past the handshake (for the log)
        self.last_seq = 0
        self.applied = 0

    # the connection ----------------------------------------------------------------------

    def run(self) -> None:
        """Follow the master until `stop()`; reconnect when it goes away.

        A bridge is a daemon: it waits for its ktserver however long it is away, and says
        what it waits for (the address, the error, since when) once, then every
        `WAITING_LOG_S` while it still waits, rather than one line a second forever."""
        host, port = self.o.kt
        down_since: float | None = None
        said = 0.0
        while not self.stop():
            self._followed = False
            try:
                self.session()
            except (OSError, kt_ulog.KtStreamError) as err:
                if isinstance(err, kt_ulog.KtStreamError):
                    raise KtBridgeError(f"malformed replication stream: {err}") from err
                now = time.monotonic()
                if self._followed or down_since is None:
                    down_since, said = now, now
                    what = "lost the" if self._followed else "cannot reach the"
                    log.warning(
                        "kt-bridge: %s ktserver at %s:%d (%s); retrying every %g s, from "
                        "ts %d",
                        what, host, port, err, RECONNECT_S, self.state.ts,
                    )  # fmt: skip
                elif now - said >= WAITING_LOG_S:
                    said = now
                    log.warning(
                        "kt-bridge: still waiting for the ktserver at %s:%d after %.0f s (%s)",
                        host, port, now - down_since, err,
                    )  # fmt: skip
                self.batch = Batch()
                self.seen_ts = self.state.ts
                time.sleep(RECONNECT_S)

    def session(self) -> None:
        """One replication connection, until `stop()` or the connection dies."""
        host, port = self.o.kt
        with socket.create_connection((host, port), timeout=10) as sock:
            sock.sendall(kt_ulog.hello(self.state.ts, self.o.sid))
            first = _recv_exactly(sock, 1)
            if first[0] != kt_ulog.MAGIC_REPLICATION:
                raise KtBridgeError(
                    f"the KT server at {host}:{port} refused replication (0x{first[0]:02x})",
                    hint="start ktserver with an update log: -ulog DIR -sid N",
                )
            log.info("kt-bridge: following %s:%d after ts %d", host, port, self.state.ts)
            self._followed = True
            parser = kt_ulog.StreamParser()
            heard = time.monotonic()
            while not self.stop():
                sock.settimeout(self._wait())
                try:
                    data = sock.recv(1 << 20)
                except TimeoutError:
                    data = None
                now = time.monotonic()
                if data == b"":
                    raise ConnectionError("the master closed the connection")
                idle = False
                if data:
                    heard = now
                    LAST_CONTACT.set(time.time())
                    for ev in parser.feed(data):
                        if isinstance(ev, kt_ulog.Nop):
                            sock.sendall(bytes([kt_ulog.MAGIC_REPLICATION]))
                            idle = True
                        else:
                            self.entry(ev)
                elif now - heard > DEAD_AFTER_S:
                    raise ConnectionError(f"nothing from the master for {DEAD_AFTER_S:g} s")
                b = self.batch
                if b.ops and self.state.pending is None:
                    if idle or now - b.started >= self.o.window_s:
                        self.flush()
                elif not b.ops and self.state.pending is None and self.seen_ts > self.state.ts:
                    # only skipped entries (another db, other operations) since the last
                    # save: move the cursor past them
                    self.state.ts = self.seen_ts
                    self.state.save()
            if self.batch.ops and self.state.pending is None:
                self.flush()

    def _wait(self) -> float:
        b = self.batch
        if b.ops and self.state.pending is None:
            return max(0.01, self.o.window_s - (time.monotonic() - b.started))
        return 1.0

    # one entry -----------------------------------------------------------------------------

    def entry(self, ev: kt_ulog.Entry) -> None:
        """Collect one stream entry; flush when a batch is full, a clear needs it, or the
        replay of the batch pending at the last stop is complete."""
        c = kt_ulog.decode(ev, persistent=self.o.persistent)
        if c is not None and c.dbid == self.o.dbid:
            if c.kind in ("set", "remove"):
                try:
                    key = mercury_key(self.o.prefix, c.key, c.ts)
                except RefusedKey as err:
                    if self.quarantine is None:
                        raise
                    # Durable before the cursor can pass this entry (it moves only when
                    # a later flush or save happens, after this returns).
                    self.quarantine.record(c, err.reason)
                else:
                    if c.kind == "set":
                        self.batch.add(_set_op(key, c.value, c.xt), c.ts, len(key) + len(c.value))
                    else:
                        self.batch.add(("delete", key), c.ts, len(key))
            elif c.kind == "clear":
                if self.batch.ops:
                    self.flush()
                self.clear(c.ts)
        self.seen_ts = max(self.seen_ts, ev.ts)
        pending = self.state.pending
        if pending is not None:
            if self.seen_ts >= int(pending["last_ts"]):
                self.flush(key=str(pending["key"]))
        elif len(self.batch.ops) >= self.o.batch_ops:
            self.flush()

    def flush(self, key: str | None = None) -> None:
        """Send the collected batch (durably noted as pending first) and move the cursor."""
        b = self.batch
        if b.ops:
            idem = key or f"kt-bridge-{b.first_ts}-{self.seen_ts}"
            self.state.pending = {"last_ts": self.seen_ts, "key": idem}
            self.state.save()
            res = self._send(b.ops, idem)
            failpoints.hit("kt_bridge.acked")  # fault tests: acknowledged, cursor not moved
            self.last_seq = max(self.last_seq, res.seq)
            self.applied += len(b.ops)
            log.info(
                "kt-bridge: applied %d changes up to ts %d (%d replayed requests)",
                len(b.ops),
                self.seen_ts,
                res.replayed,
            )
        self.state.ts = self.seen_ts
        self.state.pending = None
        self.state.save()
        self.batch = Batch()

    def _send(self, ops: list[tuple[Any, ...]], idem: str) -> BatchResult:
        """One batch through the SDK. While the root is unreachable or busy (after the
        SDK's own retries) the same batch is retried with the same key, until `stop()`;
        a refusal that cannot succeed unchanged stops the bridge."""
        while True:
            try:
                return self.client.batch(ops, idempotency_key=idem)
            except (Unavailable, RateLimited, ServerError) as err:
                if self.stop():
                    raise KtBridgeError(f"stopped with batch {idem} unacknowledged") from err
                log.warning("kt-bridge: the root did not take batch %s (%s); retrying", idem, err)
                time.sleep(RETRY_S)
            except MercuryClientError as err:
                raise KtBridgeError(
                    f"the root refused batch {idem}: {err}",
                    hint="fix the producer's grants or the data; the bridge resumes from "
                    "this batch when restarted",
                ) from err

    def clear(self, ts: int) -> None:
        """KT's clear: delete every key under the prefix (listed from the read node)."""
        if not self.can_clear:
            raise KtBridgeError(
                f"KT cleared database {self.o.dbid} (ts {ts}); the bridge needs a read node "
                "to list the keys to delete",
                hint="restart with --read-url URL of a replica or consumer node",
            )
        if self.last_seq:
            self.client.wait_applied(self.last_seq)
        keys = [it.key for it in self.client.range(self.o.prefix or None, keys_only=True)]
        if keys:
            digest = hashlib.blake2b(b"\0".join(keys), digest_size=8).hexdigest()
            res = self._send([("delete", k) for k in keys], f"kt-bridge-clear-{ts}-{digest}")
            self.last_seq = max(self.last_seq, res.seq)
        log.info("kt-bridge: KT clear at ts %d deleted %d keys", ts, len(keys))
        self.seen_ts = max(self.seen_ts, ts)
        self.state.ts = self.seen_ts
        self.state.save()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the master closed the connection")
        out += chunk
    return out


# --- one-shot import ---------------------------------------------------------------------


class KtRpc:
    """A minimal TSV-RPC client of a KT server (the import's reads)."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.http = httpx.Client(base_url=f"http://{host}:{port}", timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def call(self, proc: str, params: dict[str, str]) -> tuple[int, dict[bytes, bytes]]:
        r = self.http.post(f"/rpc/{proc}", data=params)
        out = kt_protocol.decode_tsv_response(r.content, r.headers.get("content-type", ""))
        return r.status_code, out

    def clock(self) -> int:
        """The server's current time as a KT log timestamp (milliseconds × 10⁶)."""
        status, out = self.call("report", {})
        if status != 200 or b"serv_current_time" not in out:
            raise KtBridgeError(f"KT report failed ({status})")
        return int(float(out[b"serv_current_time"]) * 1000) * 1_000_000

    def records(self, dbid: int) -> Iterator[tuple[bytes, bytes]]:
        """Every record of database `dbid`, in the database's order, by an RPC cursor."""
        cur = {"CUR": "1", "DB": str(dbid)}
        status, out = self.call("cur_jump", cur)
        if status == 450:
            return  # empty database
        if status != 200:
            raise KtBridgeError(f"KT cur_jump failed ({status}): {out.get(b'ERROR', b'')!r}")
        try:
            while True:
                status, out = self.call("cur_get", {"CUR": "1", "step": "true"})
                if status == 450:
                    return
                if status != 200:
                    raise KtBridgeError(f"KT cur_get failed ({status}): {out.get(b'ERROR')!r}")
                yield out[b"key"], out[b"value"]
        finally:
            self.call("cur_delete", {"CUR": "1"})


def import_db(
    opts: Options, client: Client, state: BridgeState, quarantine: Quarantine | None = None
) -> int:
    """Copy every record of the KT database once; returns how many. The state file gets a
    cursor from one second before the copy began (when it has none), so the bridge started
    next replays every change made during the copy."""
    host, port = opts.kt
    rpc = KtRpc(host, port)
    try:
        start_ts = rpc.clock() - 1000 * 1_000_000
        ops: list[tuple[Any, ...]] = []
        n = 0
        for key, value in rpc.records(opts.dbid):
            try:
                ops.append(("set", mercury_key(opts.prefix, key, 0), value))
            except RefusedKey as err:
                if quarantine is None:
                    raise
                quarantine.record(kt_ulog.Change(0, 0, opts.dbid, "set", key, value), err.reason)
                continue
            if len(ops) >= opts.batch_ops:
                client.batch(ops, idempotency_key=f"kt-import-{start_ts}-{n}")
                n += len(ops)
                ops = []
        if ops:
            client.batch(ops, idempotency_key=f"kt-import-{start_ts}-{n}")
            n += len(ops)
    finally:
        rpc.close()
    if state.ts == 0 and state.pending is None:
        state.ts = start_ts
        state.save()
    log.info("kt-bridge: imported %d records; the bridge resumes after ts %d", n, state.ts)
    return n
