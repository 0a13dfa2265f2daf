"""Multi-value replies (a memcached multi-get, a KT binary get_bulk) made a piece at a time,
so a connection never holds more than a piece of its reply.

A request of a few KB can name one big key a thousand times; built whole, its reply is
hundreds of MB held by the server until a client that never reads is timed out. Here a
reply is made in two passes:

1. `collect`: the keys are read slice by slice (one short read transaction each), counting
   the hits and their bytes against the caller's cap. While the values come to at most
   `COLLECT_BYTES` they are kept, and the caller answers such a reply whole (`Small`), in
   one piece, as before. Beyond that nothing is kept: the pass only counts (`Big`: which
   keys hit, so how many).
2. `stream` (for `Big`): the hits are read again, a piece of about `PIECE_BYTES` (or one
   value) per short read transaction, and each piece is yielded on its own. `net.tcp`
   writes it and asks for the next only while the client takes what it was sent
   (back-pressure), so the connection holds the transport's high-water mark plus a piece.

The count and head are those of the first pass. A hit that has gone by the second pass, or
fails its CRC there, cannot be answered any more: part of the reply is already out, so the
connection is dropped (`Cut`, a `net.tcp.Abort`) — the client sees a cut reply, never a wrong one.
The caller's counters (hits, misses) are therefore kept by `stream`'s `done`, called once
every hit has been read again — when the reply can no longer be cut — so a cut reply
counts no hits it did not answer.
A value changed between the passes is served as it is now (as in KT, a bulk read is not
one snapshot).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from core.errors import CRCError
from net.tcp import Abort
from store.reader import Reader
from store.store import Store

#: A reply whose values come to at most this is read once and answered whole.
COLLECT_BYTES = 1 << 20
#: A streamed reply is read and handed on in pieces of about this much (or one value).
PIECE_BYTES = 256 << 10
#: Keys a multi-key read (KT get_bulk, memcached multi-get) reads per slice: one read
#: transaction, then the other connections of the loop go.
BULK_SLICE = 4096

K = TypeVar("K")  # a key as the protocol names it (memcached: bytes; KT: (db, key))
H = TypeVar("H")  # a hit, as the protocol encodes it


@dataclass(frozen=True, slots=True)
class Spec(Generic[K, H]):
    """How one protocol reads and encodes a multi-value reply."""

    #: The hit of one key in a read transaction, or None (raises CRCError).
    fetch: Callable[[Reader, K], H | None]
    #: Value bytes of a hit (what the cap counts).
    size: Callable[[H], int]
    #: Wire bytes of some hits, in order.
    encode: Callable[[list[H]], bytes]
    #: Wire bytes before the hits, given their number.
    head: Callable[[int], bytes]
    #: Wire bytes after the hits.
    tail: bytes
    #: Value bytes one reply may hold; beyond it the request fails (`TooLarge`).
    max_bytes: int
    #: Keys read per read transaction in the first pass (then b"" is yielded: other
    #: connections go).
    slice_keys: int


@dataclass(frozen=True, slots=True)
class Small(Generic[H]):
    """The whole reply, read in one pass."""

    hits: list[H]


@dataclass(frozen=True, slots=True)
class Big:
    """A reply too big to hold: positions of the keys that hit, to be read again."""

    hit_at: list[int]


@dataclass(frozen=True, slots=True)
class TooLarge:
    """The values exceed `Spec.max_bytes`: nothing was sent; answer the protocol's error."""


@dataclass(frozen=True, slots=True)
class Corrupt:
    """A value failed its CRC in the first pass: nothing was sent; answer the error."""

    err: CRCError


Collected = Small[H] | Big | TooLarge | Corrupt


class Cut(Abort):
    """A streamed reply could not be finished (a hit has gone, or fails its CRC, since the
    first pass): part of it is out, so the connection must be dropped."""


def collect(
    store: Store, keys: Sequence[K], spec: Spec[K, H], *, give_up_big: bool = False
) -> Generator[bytes, None, Collected[H]]:
    """The first pass (see the module docstring); yields b"" between slices. With
    `give_up_big`, stops at the first sign of a `Big` reply and returns `Big([])` (for a
    shortcut that answers only small replies, so it wastes at most `COLLECT_BYTES`)."""
    hits: list[H] = []
    hit_at: list[int] = []
    keep = True
    size = 0
    for start in range(0, len(keys), spec.slice_keys):
        if start:
            yield b""  # other connections run before the next slice
        try:
            with store.reader() as r:
                for i in range(start, min(start + spec.slice_keys, len(keys))):
                    hit = spec.fetch(r, keys[i])
                    if hit is None:
                        continue
                    hit_at.append(i)
                    size += spec.size(hit)
                    if size > spec.max_bytes:
                        return TooLarge()
                    if keep:
                        if size <= COLLECT_BYTES:
                            hits.append(hit)
                            continue
                        if give_up_big:
                            return Big([])
                        keep = False
                        hits.clear()  # from here on only counted
        except CRCError as err:
            return Corrupt(err)
    if keep:
        return Small(hits)
    return Big(hit_at)


def stream(
    store: Store,
    keys: Sequence[K],
    big: Big,
    spec: Spec[K, H],
    done: Callable[[], None] | None = None,
) -> Generator[bytes, None, None]:
    """The second pass: the reply of `big`, yielded in pieces; raises `Cut` when it cannot
    be finished. No read transaction is held across a yield. `done` (the caller counting
    the reply) is called once every hit has been read again, before the last piece is
    yielded: never for a reply that is cut, nor for one whose client went away before
    taking all but its last piece."""
    yield spec.head(len(big.hit_at))
    at = big.hit_at
    i = 0
    if not at and done is not None:
        done()
    while i < len(at):
        piece: list[H] = []
        size = 0
        try:
            with store.reader() as r:
                while i < len(at) and size < PIECE_BYTES:
                    hit = spec.fetch(r, keys[at[i]])
                    i += 1
                    if hit is None:
                        raise Cut("gone", "a value went while its reply was being sent")
                    piece.append(hit)
                    size += spec.size(hit)
        except CRCError as err:
            raise Cut("crc", err.message) from err
        if i == len(at) and done is not None:
            done()  # every hit read: the reply can no longer be cut
        yield spec.encode(piece)
    if spec.tail:
        yield spec.tail
