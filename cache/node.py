"""The cache node's engine: follows its source's invalidation stream, answers reads from
its store, fetches misses (I/O around the pure `cache.state`).

One event loop does everything: the stream's frames are applied in the transport's
callback as they arrive (`_on_frame`), and a read's miss awaits its FETCHED frame; the
state and the store change only on the loop, so a decision and the write it calls for are
never interleaved with another.

Sources are tried in order (`--source`); the node stays on one until its connection ends,
then tries the next (after the last, the first again, with a backoff). With no source,
hits are served and misses raise `Unavailable` (503 + Retry-After).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from cache import metrics
from cache.policy import ENTRY_OVERHEAD
from cache.rules import Install
from cache.state import CacheState, Counters, Held
from cache.store import CacheStore, Put
from core.errors import ProtocolError
from replicator import frames
from replicator.invalidation import (
    MAX_FETCH_KEYS,
    STATUS_BEHIND,
    Fetch,
    Fetched,
    decode_fetched,
    decode_invalidate,
    encode_fetch,
)
from replicator.lag import lag_seconds
from replicator.transport import Frame, Link, Transport

log = logging.getLogger("mercury.cache")

#: How long a miss waits for its source's answer before the read answers 503.
FETCH_TIMEOUT = 5.0
#: Misses in flight at once (FETCH frames awaiting their answer); more wait their turn.
MAX_INFLIGHT = 64
#: Backoff between two connection attempts after every source failed.
BACKOFF_MIN, BACKOFF_MAX = 0.1, 2.0
#: Fetches of a key whose answer came back stale (an answer older than what the node
#: applied or served) before the read answers 503.
STALE_RETRIES = 2
CONNECT_TIMEOUT = 5.0
_FRAMES = frozenset({frames.INVALIDATE, frames.HEARTBEAT, frames.FETCHED, frames.REFUSE})


class Unavailable(Exception):
    """A miss cannot be answered now (no source, source behind, answers stale): 503."""


class TooLarge(Exception):
    """The values asked for exceed `MAX_ANSWER_BYTES`: ask for fewer keys at once (413)."""


#: Bytes of values one read may be answered with (as a replica's get_bulk).
MAX_ANSWER_BYTES = 64 << 20


class Answer(NamedTuple):
    """One key's answer to a read: value (None: absent), version (0: absent), the read
    seq it comes from, and how it was served ("hit", "negative_hit", "miss")."""

    value: bytes | None
    version: int
    read_seq: int
    served: str


@dataclass
class Heard:
    """What the node heard from the root's heartbeats (for its lag)."""

    hb_time_us: int = 0
    hb_seq: int = 0
    hb_interval_ms: int = 1000
    known_us: int = 0


@dataclass
class _Session:
    link: Link
    address: str
    pending: dict[int, asyncio.Future[Fetched]] = field(default_factory=dict)


class CacheNode:
    """See the module docstring."""

    def __init__(
        self,
        store: CacheStore,
        max_bytes: int,
        sources: Sequence[tuple[str, int]],
        transport: Transport,
        *,
        max_lag: float | None = None,
    ) -> None:
        self.store = store
        self.sources = list(sources)
        self.transport = transport
        self.max_lag = max_lag
        self.client_id = os.urandom(16)
        self.db_id = store.db_id()
        self.counters = Counters()
        self.state = CacheState(max_bytes, store.applied(), store.horizon(), self.counters)
        self.heard = Heard()
        self._session: _Session | None = None
        self._next_request = 1
        #: FETCH frames sent (a read of large values takes several).
        self.fetches = 0
        self._slots = asyncio.Semaphore(MAX_INFLIGHT)
        #: Set when the stream must restart at the source's head without its history.
        self._restart = False
        self.source_address: str | None = None
        self._load()
        metrics.register(lambda: self.counters, self.lag)

    def _load(self) -> None:
        """Warm start: every entry the store holds goes back into the policy, the ones
        protected at the last clean stop into the protected segment, the others into
        probation."""
        evicted: list[bytes] = []
        protected = self.store.take_protected()
        for key, held, vlen in self.store.load():
            size = len(key) + vlen + ENTRY_OVERHEAD
            evicted += self.state.load(key, held, size, key in protected)
        if evicted:  # a smaller --max-bytes than the store was filled with
            self.store.commit(deletes=evicted)
        metrics.BYTES.set(self.state.held_bytes)
        metrics.ENTRIES.set(len(self.state.held))
        log.info(
            "cache opened: %d entries, %d bytes, applied seq %d",
            len(self.state.held),
            self.state.held_bytes,
            self.state.applied,
        )

    def close(self) -> None:
        """A clean stop: record the protected segment (see `_load`), close the store."""
        self.store.save_protected(self.state.policy.protected_keys())
        self.store.close()

    # --- reads ---------------------------------------------------------------------

    async def get(self, keys: Sequence[bytes]) -> list[Answer]:
        """Answers for `keys`, in order; `Unavailable` when a miss cannot be answered."""
        out: list[Answer | None] = [None] * len(keys)
        missing: list[int] = []
        for i, key in enumerate(keys):
            held = self.state.lookup(key)
            if held is None:
                missing.append(i)
                continue
            got = self.store.get(key)
            if got is None:  # cannot happen: the state and the store change together
                raise Unavailable(f"cache entry of {key!r} vanished")
            value = got[1]
            kind = "negative_hit" if held.negative else "hit"
            out[i] = Answer(value, held.version, held.read_seq, kind)
        if missing:
            t0 = time.perf_counter()
            await self._fetch_into(keys, missing, out)
            metrics.MISS_SECONDS.observe(time.perf_counter() - t0)
        return [a for a in out if a is not None]

    async def _fetch_into(
        self, keys: Sequence[bytes], missing: list[int], out: list[Answer | None]
    ) -> None:
        held = sum(len(a.value) for a in out if a is not None and a.value is not None)
        todo = missing
        for _attempt in range(STALE_RETRIES):
            stale: list[int] = []
            for start in range(0, len(todo), MAX_FETCH_KEYS):
                part = todo[start : start + MAX_FETCH_KEYS]
                while part:  # a source answers a prefix when the values are large
                    answer = await self._fetch([keys[i] for i in part])
                    got = part[: len(answer.items)]
                    stale += self._install(keys, got, answer, out)
                    held += sum(len(v) for v, _version in answer.items if v is not None)
                    if held > MAX_ANSWER_BYTES:
                        raise TooLarge(
                            f"the values of these keys exceed {MAX_ANSWER_BYTES} bytes; "
                            "ask for fewer keys per request"
                        )
                    part = part[len(answer.items) :]
            if not stale:
                return
            todo = stale
        raise Unavailable("the source's answers are older than what this cache applied")

    def _install(
        self, keys: Sequence[bytes], part: list[int], answer: Fetched, out: list[Answer | None]
    ) -> list[int]:
        """Apply one FETCHED to the state and the store; returns the indexes still stale."""
        stale: list[int] = []
        # What the store must hold of each key touched, the last decision winning (a key
        # installed early in the answer may be evicted by a later one): a Put, or None.
        final: dict[bytes, Put | None] = {}
        for i, (value, version) in zip(part, answer.items, strict=True):
            key = keys[i]
            o = self.state.answer(key, answer.read_seq, value, version)
            if o.decision is Install.STALE:
                stale.append(i)
                continue
            for k in o.delete:
                final[k] = None
            if o.decision is Install.KEEP:
                held = self.state.held[key]
                got = final.get(key) or self.store.get(key)
                kept = got[-1] if got is not None else None
                out[i] = Answer(kept, held.version, held.read_seq, "miss")
                continue
            h = self.state.held.get(key)
            if o.put and h is not None:
                final[key] = Put(key, h, value)
            out[i] = Answer(value, version if value is not None else 0, answer.read_seq, "miss")
        self.store.commit(
            puts=[p for p in final.values() if p is not None],
            deletes=[k for k, p in final.items() if p is None],
            horizon=self.state.rules.horizon,
        )
        metrics.BYTES.set(self.state.held_bytes)
        metrics.ENTRIES.set(len(self.state.held))
        return stale

    async def _fetch(self, keys: list[bytes]) -> Fetched:
        s = self._session
        if s is None:
            raise Unavailable("no source connected")
        async with self._slots:
            if s is not self._session or s.link.closing():
                raise Unavailable("the source's connection was lost")
            req = self._next_request
            self._next_request = (req + 1) & 0xFFFFFFFF or 1
            fut: asyncio.Future[Fetched] = asyncio.get_running_loop().create_future()
            s.pending[req] = fut
            self.fetches += 1
            try:
                s.link.write(encode_fetch(Fetch(req, self.state.rules.horizon, keys)))
                async with asyncio.timeout(FETCH_TIMEOUT):
                    answer = await fut
            except (TimeoutError, ConnectionError, OSError, RuntimeError) as err:
                raise Unavailable(f"no answer from source {s.address}: {err!r}") from None
            finally:
                s.pending.pop(req, None)
        if answer.status == STATUS_BEHIND:
            raise Unavailable(
                f"source {s.address} is at seq {answer.read_seq}, behind this cache's "
                f"{self.state.rules.horizon}"
            )
        if not 1 <= len(answer.items) <= len(keys):
            raise Unavailable(f"source {s.address} answered {len(answer.items)} keys")
        return answer

    # --- lag and status --------------------------------------------------------------

    def lag(self) -> float | None:
        h = self.heard
        return lag_seconds(
            time.time_ns() // 1000,
            self.state.applied,
            h.known_us,
            h.hb_time_us,
            h.hb_seq,
            h.hb_interval_ms,
        )

    def lagging(self) -> bool:
        """True when --max-lag is set and the lag exceeds it (or nothing was heard yet)."""
        if self.max_lag is None:
            return False
        lag = self.lag()
        return lag is None or lag > self.max_lag

    def status(self) -> dict[str, object]:
        lag = self.lag()
        c = self.state.counters
        return {
            "role": "cache",
            "db_id": None if self.db_id is None else _uuid(self.db_id),
            "seq": self.state.applied,
            "horizon": self.state.rules.horizon,
            "source": self.source_address,
            "connected": self._session is not None,
            "lag_s": lag,
            "max_lag_s": self.max_lag,
            "lagging": self.lagging(),
            "max_bytes": self.state.policy.max_bytes,
            "bytes": self.state.held_bytes,
            "entries": len(self.state.held),
            "disk_bytes": self.store.disk_bytes(),
            "hits": c.hits,
            "negative_hits": c.negative_hits,
            "misses": c.misses,
            "evictions": c.evictions,
            "invalidations": c.invalidations,
            "stale_answers": c.stale_answers,
        }

    # --- the stream ------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the sources for ever (cancel to stop)."""
        backoff = BACKOFF_MIN
        while True:
            for host, port in self.sources:
                address = f"{host}:{port}"
                try:
                    streamed = await self._follow(host, port, address)
                except asyncio.CancelledError:
                    raise
                except (ProtocolError, ConnectionError, OSError, TimeoutError, ValueError) as err:
                    log.warning("source %s: %s", address, err)
                    streamed = False
                if streamed:
                    backoff = BACKOFF_MIN
            await asyncio.sleep(backoff)
            backoff = min(BACKOFF_MAX, backoff * 2)

    def _hello(self) -> bytes:
        fresh = self.db_id is None or self._restart
        return frames.encode_hello(
            frames.Hello(
                frames.PROTOCOL_VERSION,
                frames.MODE_INVALIDATE,
                frames.OPT_NEWEST_ONLY if fresh else 0,
                self.client_id,
                self.db_id or frames.ZERO_ID,
                self.state.applied,
                0,
                0,
                frames.ZERO_SHA,
            )
        )

    async def _follow(self, host: str, port: int, address: str) -> bool:
        """One connection to one source; True when it streamed (not refused at once)."""
        link = await self.transport.connect(host, port, timeout=CONNECT_TIMEOUT)
        try:
            await link.send(self._hello(), CONNECT_TIMEOUT)
            first = await link.recv(CONNECT_TIMEOUT, frozenset({frames.WELCOME, frames.REFUSE}))
            if first.type == frames.REFUSE:
                refusal = frames.decode_refuse(bytes(first.body))
                self._refused(address, refusal)
                return False
            welcome = frames.decode_welcome(bytes(first.body))
            self._welcomed(address, welcome)
            session = _Session(link, address)
            done = link.push(lambda f: self._on_frame(session, f), _FRAMES)
            self._session = session
            self.source_address = address
            log.info("following %s from seq %d", address, self.state.applied)
            try:
                await done
            finally:
                self._session = None
                for fut in session.pending.values():
                    if not fut.done():
                        fut.set_exception(ConnectionResetError("source connection ended"))
            err = done.exception() if not done.cancelled() else None
            if err is not None:
                log.warning("source %s: %s", address, err)
            else:
                log.info("source %s closed the connection", address)
            return True
        finally:
            link.abort()

    def _refused(self, address: str, refusal: frames.Refuse) -> None:
        log.warning("source %s refused: %s", address, refusal.message)
        if refusal.code == frames.REFUSE_BOOTSTRAP:
            # The source no longer holds the invalidations after our applied seq: start
            # again at its head, dropping everything held (it may have changed since).
            self._restart = True
        elif refusal.code == frames.REFUSE_DB_ID:
            # Another store altogether: nothing held belongs to it. Only if no source
            # holds ours does this matter: the next one in the list may.
            log.error("source %s holds another store than this cache's", address)

    def _welcomed(self, address: str, w: frames.Welcome) -> None:
        if self.db_id != w.db_id or self._restart:
            # First connection, a restart without history, or a different store: whatever
            # is held was not invalidated up to the source's head; drop it and start there
            # (the horizon stays when the store is the same one: what was served stays so).
            dropped = list(self.state.held)
            same = self.db_id == w.db_id
            self.state = CacheState(
                self.state.policy.max_bytes,
                w.head_seq,
                self.state.rules.horizon if same else w.head_seq,
                self.counters,
            )
            self.store.commit(
                clear=True,
                applied=w.head_seq,
                horizon=self.state.rules.horizon,
                db_id=w.db_id,
            )
            self.db_id = w.db_id
            self._restart = False
            if dropped:
                log.warning(
                    "source %s: dropped %d entries, following from its head %d",
                    address,
                    len(dropped),
                    w.head_seq,
                )
        self.heard.hb_interval_ms = w.heartbeat_ms

    def _on_frame(self, session: _Session, f: Frame) -> None:
        """Each frame of the source as it arrives (on the loop)."""
        if f.type == frames.INVALIDATE:
            inv = decode_invalidate(f.body)
            if inv.first_seq != self.state.applied + 1 or inv.last_seq < inv.first_seq:
                raise ProtocolError(
                    f"invalidations of seq {inv.first_seq}..{inv.last_seq} do not continue "
                    f"seq {self.state.applied}"
                )
            drop = self.state.invalidate(inv.last_seq, inv.changes)
            self.store.commit(deletes=drop, applied=inv.last_seq, horizon=self.state.rules.horizon)
            metrics.APPLIED.set(inv.last_seq)
            metrics.BYTES.set(self.state.held_bytes)
            metrics.ENTRIES.set(len(self.state.held))
        elif f.type == frames.FETCHED:
            answer = decode_fetched(f.body)
            fut = session.pending.get(answer.request)
            if fut is not None and not fut.done():
                fut.set_result(answer)
        elif f.type == frames.HEARTBEAT:
            hb = frames.decode_heartbeat(bytes(f.body))
            if hb.sent_seq != self.state.applied:
                raise ProtocolError(
                    f"source sent up to seq {hb.sent_seq}, this cache applied "
                    f"{self.state.applied}: invalidations lost"
                )
            h = self.heard
            h.hb_time_us, h.hb_seq, h.hb_interval_ms = hb.time_us, hb.seq, hb.interval_ms
            if self.state.applied >= hb.seq:
                h.known_us = max(h.known_us, hb.time_us)
        elif f.type == frames.REFUSE:
            refusal = frames.decode_refuse(bytes(f.body))
            self._refused(session.address, refusal)
            raise ProtocolError(f"source ended the stream: {refusal.message}")


def _uuid(raw: bytes) -> str:
    import uuid

    return str(uuid.UUID(bytes=raw))


async def stop_task(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


__all__ = ["Answer", "CacheNode", "Held", "TooLarge", "Unavailable", "stop_task"]
