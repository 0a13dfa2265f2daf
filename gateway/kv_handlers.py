"""The producer write handlers, independent of the HTTP framework.

Each handler takes plain inputs — lower-case header dict, raw path, raw query string and an
async body reader with a size limit (`gateway.http.body_reader`, the one reader) — and
returns an `Answer`. The FastAPI routes (which document the endpoints in OpenAPI) and the
raw-ASGI fast path (`gateway/fastpath.py`, which serves them in production without
FastAPI's per-request machinery) both call these, so both give byte-identical answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import itemgetter
from urllib.parse import parse_qsl, unquote_to_bytes

from acl.model import Producer
from core import ttl
from core.errors import BadRequestError
from gateway import bodies, idempotency
from gateway.answers import Answer, batch_answer, kv_answer
from gateway.guards import check_guards
from gateway.http import BodyReader
from gateway.writes import Gateway
from store.ops import DELETE, SET, Op, Result

_EXPECT = itemgetter(4)  # Op.expect_seq

KV_PREFIX = b"/v1/kv/"


def key_of(raw_path: bytes, max_key: int) -> bytes:
    """The key of a ``/v1/kv/{key}`` raw path (percent-decoded bytes).

    Routing matched the *decoded* path; the key is cut from the raw one. A route spelt
    with escapes (``/v1/k%76/a``, ``/v1/kv%2Fa``) would put the wrong bytes in the key —
    a 403 naming a key never sent, or a write to another key than meant — so it is
    refused."""
    path = raw_path.split(b"?", 1)[0]
    if not path.startswith(KV_PREFIX):
        raise BadRequestError(
            "the path must begin with /v1/kv/ spelt without percent-escapes",
            hint="percent-encode the key only",
        )
    return bodies.key_from_path(path[len(KV_PREFIX) :], max_key)


def query_flag(query: bytes, name: str) -> bool:
    """Whether the query string sets `name` true (``1``, ``true``, ``yes``)."""
    if not query:
        return False
    for k, v in parse_qsl(query.decode("latin-1")):
        if k == name:
            return v.lower() in ("1", "true", "yes")
    return False


def query_value(query: bytes, name: str) -> str | None:
    """The value of query parameter `name` (percent-decoded), None when absent."""
    if not query:
        return None
    for k, v in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
        if k == name:
            return v
    return None


def deadline(query: bytes) -> int:
    """The deadline (µs) a PUT asks for with ``?ttl=`` or ``?expires_at=``; 0 when none
    (`core/ttl.py` holds the bounds)."""
    if b"ttl" not in query and b"expires_at" not in query:  # the common case, no parse
        return 0
    return ttl.deadline_of(
        query_value(query, "ttl"), query_value(query, "expires_at"), ttl.now_us()
    )


def is_async(query: bytes) -> bool:
    """Whether the query string asks for ``async=true`` (202 on enqueue)."""
    return query_flag(query, "async")


def async_mode(query: bytes, conditional: bool) -> bool:
    """`is_async`, refused (400) for a conditional write: a 202 is sent before the commit
    decides the condition, so its outcome could never reach the client."""
    if not is_async(query):
        return False
    if conditional:
        raise BadRequestError(
            "a conditional write cannot be async: the condition is decided at commit, "
            "after a 202 would have been sent",
            hint="drop ?async=true to learn the condition's outcome",
        )
    return True


def condition(h: Mapping[str, str]) -> int | None:
    """expect_seq from If-Match / If-None-Match (None when unconditional)."""
    im = h.get("if-match")
    inm = h.get("if-none-match")
    if im is None and inm is None:
        return None
    if im is not None and inm is not None:
        raise BadRequestError("send If-Match or If-None-Match, not both")
    if inm is not None:
        if inm.strip() != "*":
            raise BadRequestError('If-None-Match supports only "*" (create only)')
        return 0
    assert im is not None
    tag = im.strip()
    if tag.startswith("W/"):
        tag = tag[2:]
    tag = tag.strip('"')
    if not tag.isdigit() or len(tag) > 19:
        raise BadRequestError(f'If-Match must be "<seq>", got {im!r}')
    return int(tag)


def refuse_key_conditions(h: Mapping[str, str], what: str) -> None:
    """400 for If-Match / If-None-Match on a request that names no single key: refused
    rather than ignored (a condition must never silently not apply)."""
    if "if-match" in h or "if-none-match" in h:
        raise BadRequestError(
            f"If-Match / If-None-Match apply to one key and are not supported on {what}",
            hint='in a batch, give each op its own condition: "if_seq": N (0 = absent) or '
            '"if_absent": true',
        )


async def put_kv(
    gw: Gateway, h: Mapping[str, str], raw_path: bytes, query: bytes, read: BodyReader, t0: float
) -> Answer:
    """PUT /v1/kv/{key}: 200 `{"seq", "status": "written" | "duplicate" | "superseded"}`
    after commit; ``?ttl=`` / ``?expires_at=`` give the key a deadline (a PUT without one
    clears the key's)."""
    p = gw.producer(h.get("authorization"))
    key = key_of(raw_path, gw.settings.max_key)
    cond = condition(h)
    dl = deadline(query)
    value = await read(gw.settings.max_value, "value")
    idem = h.get("idempotency-key")
    return await gw.write(
        p,
        [Op(SET, key, value, p.name, cond, dl)],
        len(key) + len(value),
        kv_answer,
        idem=idem,
        fp=await idempotency.fingerprint_async("PUT", raw_path, query, h, value) if idem else "",
        is_async=async_mode(query, cond is not None),
        t0=t0,
    )


async def delete_kv(
    gw: Gateway, h: Mapping[str, str], raw_path: bytes, query: bytes, read: BodyReader, t0: float
) -> Answer:
    """DELETE /v1/kv/{key}: 200 `{"seq", "status": "deleted" | "absent"}` after commit."""
    p = gw.producer(h.get("authorization"))
    key = key_of(raw_path, gw.settings.max_key)
    cond = condition(h)
    idem = h.get("idempotency-key")
    return await gw.write(
        p,
        [Op(DELETE, key, b"", p.name, cond)],
        len(key),
        kv_answer,
        idem=idem,
        fp=idempotency.fingerprint("DELETE", raw_path, query, h, b"") if idem else "",
        is_async=async_mode(query, cond is not None),
        t0=t0,
    )


async def post_batch(
    gw: Gateway, h: Mapping[str, str], raw_path: bytes, query: bytes, read: BodyReader, t0: float
) -> Answer:
    """POST /v1/batch: every op's key checked before any applies; totals after commit, and
    per-op ``results`` with ``?results=true`` or when any op carries a condition."""
    p = gw.producer(h.get("authorization"))
    refuse_key_conditions(h, "a batch")
    s = gw.settings
    body = await read(s.max_batch_body, "batch body")
    ops, nbytes = bodies.batch_body_ops(
        body,
        h.get("content-type"),
        p.name,
        max_ops=s.max_batch_ops,
        max_key=s.max_key,
        max_value=s.max_value,
    )
    idem = h.get("idempotency-key")
    answer: Callable[[list[Result]], Answer] = batch_answer
    # `list.count` in C rather than a generator step per op (Op.expect_seq is field 4)
    conditional = list(map(_EXPECT, ops)).count(None) != len(ops)
    mode = async_mode(query, conditional)
    if query_flag(query, "results") or conditional:
        keys = [op.key for op in ops]

        def with_results(results: list[Result]) -> Answer:
            return batch_answer(results, keys)

        answer = with_results

    return await gw.write(
        p,
        ops,
        nbytes,
        answer,
        idem=idem,
        fp=await idempotency.fingerprint_async("POST", raw_path, query, h, body) if idem else "",
        is_async=mode,
        t0=t0,
    )


def prefix_of(query: bytes, max_key: int) -> bytes:
    """The ``prefix=`` of a query string as bytes (percent-decoded), 1 to `max_key` bytes."""
    for part in query.split(b"&"):
        name, _, value = part.partition(b"=")
        if name == b"prefix":
            prefix = unquote_to_bytes(value.replace(b"+", b" "))
            bodies.check_key(prefix, max_key, "prefix")
            return prefix
    raise BadRequestError("DELETE /v1/kv needs ?prefix=P (the keys under P are deleted)")


def prefix_limit(
    p: Producer, prefix: bytes, max_ops: int, open_deletes: Callable[[str], int]
) -> int:
    """How many keys under `prefix` one request may delete: the request limit, and for
    every guarded keyspace the prefix touches, its mass-delete cap minus the deletes of
    this producer already in the open batch (`open_deletes(keyspace)`)."""
    limit = max_ops
    for ks, g in p.guards.items():
        k = ks.encode()
        if g.max_deletes_per_batch is not None and (prefix.startswith(k) or k.startswith(prefix)):
            limit = min(limit, g.max_deletes_per_batch - open_deletes(ks))
    return max(0, limit)


async def delete_prefix(
    gw: Gateway, h: Mapping[str, str], raw_path: bytes, query: bytes, read: BodyReader, t0: float
) -> Answer:
    """DELETE /v1/kv?prefix=P: delete the keys under P (P inside the producer's keyspaces),
    at most one batch's worth per request (the request limit and the keyspace's
    mass-delete guard); ``more`` says whether keys remain under P. Clients loop."""
    p = gw.producer(h.get("authorization"))
    refuse_key_conditions(h, "a prefix delete")
    prefix = prefix_of(query, gw.settings.max_key)
    # Every key under P must be the producer's to delete: P lies inside one keyspace.
    gw.check_keys(p, [Op(DELETE, prefix)])
    # A request its rate quota can never admit would be a 413 for ever: a client cannot
    # split a prefix delete, so the request's share is sized to what the quota admits.
    max_ops, max_bytes = gw.admission.largest(p)
    cap = gw.settings.max_batch_ops if max_ops is None else min(gw.settings.max_batch_ops, max_ops)
    limit = prefix_limit(p, prefix, cap, lambda ks: gw.batcher.open_deletes(p.name, ks))
    with gw.store.reader() as r:
        keys = [k for k, _ in r.scan(prefix=prefix, limit=limit + 1, keys_only=True)]
    first = keys[:1]  # the scan reads one key even when the limit is 0
    if first and prefix_limit(p, prefix, cap, lambda _ks: 0) == 0:
        # A guard of 0 deletes per batch: no batch window will ever let one through, so
        # refused like a single-key delete (400), not "0 deleted, more" for ever.
        check_guards(p, [Op(DELETE, first[0])], gw.batcher.open_deletes)
    more = len(keys) > limit
    keys = keys[:limit]
    if max_bytes is not None:  # a request's bytes are its keys' (key + empty value)
        n, total = 0, 0
        while n < len(keys) and total + len(keys[n]) <= max_bytes:
            total += len(keys[n])
            n += 1
        n = max(n, 1)  # one key over the whole quota: the admission's 413 names the bound
        more = more or n < len(keys)
        keys = keys[:n]
    if not keys:
        body = batch_answer([]).body
        body["more"] = more  # true only when the open batch spent the delete guard
        return Answer(200, body, {})

    def answer(results: list[Result]) -> Answer:
        a = batch_answer(results)
        a.body["more"] = more
        return a

    idem = h.get("idempotency-key")
    return await gw.write(
        p,
        [Op(DELETE, k, b"", p.name) for k in keys],
        sum(len(k) for k in keys),
        answer,
        idem=idem,
        fp=idempotency.fingerprint("DELETE", raw_path, query, h, b"") if idem else "",
        is_async=is_async(query),
        t0=t0,
    )
