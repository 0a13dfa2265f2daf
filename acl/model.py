"""Producers, consumers, their keyspaces, quotas, write guards and tokens: plain values and
pure decisions.

A *keyspace* is a key prefix (UTF-8 text). A producer may write a key iff the key starts
with one of its keyspaces. Two keyspaces overlap when one is a prefix of the other; a grant
that overlaps another producer's keyspace is refused unless both producers list their
overlapping keyspace in ``shared``. A *consumer* may read its keyspaces (any overlap with
producers or other consumers is fine: reading is not owning).

Nothing here does I/O: the gateway stores `Acl.to_json()` as the replicated document
``acl`` (`store/docs.py`, through the log, so every replica holds it) and rebuilds the
`Acl` from it at start. The stored form holds token *hashes* and metadata, never a token.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from acl.tokens import hash_token
from core.errors import BadRequestError, KeyspaceOverlapError, NotFoundError

#: Replicated document holding the ACL (JSON); up to format 2 a node-local document of the
#: same name.
DOC_NAME = "acl"
MAX_NAME = 255


@dataclass(frozen=True, slots=True)
class Quota:
    """Write quota of one producer; None means unlimited.

    `burst` is the ops bucket size (default: one second of `ops_per_s`), `bytes_burst` the
    bytes bucket size (default: one second of `bytes_per_s`). A request over budget is held
    up to `max_delay_ms`, then refused (429). In `shadow` mode excess is only counted.
    """

    ops_per_s: float | None = None
    burst: float | None = None
    bytes_per_s: float | None = None
    bytes_burst: float | None = None
    max_delay_ms: int = 1000
    max_bytes_stored: int | None = None
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class Guard:
    """Write guard of one keyspace: refuse empty values, cap deletes per batch."""

    refuse_empty: bool = False
    max_deletes_per_batch: int | None = None


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """A token as stored: its hash, a label, when it was created and when it expires
    (µs since the epoch; None = never)."""

    hash: str
    label: str = ""
    created_us: int = 0
    expires_us: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The stored form."""
        return {
            "hash": self.hash,
            "label": self.label,
            "created_us": self.created_us,
            "expires_us": self.expires_us,
        }

    @classmethod
    def from_json(cls, d: Any) -> TokenInfo:
        """From `to_json()` output, or a bare hash (stored before tokens had metadata)."""
        if isinstance(d, str):
            return cls(d)
        exp = d.get("expires_us")
        return cls(
            str(d["hash"]),
            str(d.get("label", "")),
            int(d.get("created_us", 0)),
            None if exp is None else int(exp),
        )

    def expired(self, now_us: int) -> bool:
        """Whether the token is past its expiry at `now_us`."""
        return self.expires_us is not None and now_us >= self.expires_us


@dataclass(frozen=True, slots=True)
class Consumer:
    """One consumer: the keyspaces it may read and its tokens (token id -> TokenInfo)."""

    name: str
    keyspaces: tuple[str, ...] = ()
    tokens: dict[str, TokenInfo] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        """The consumer's configuration as the admin API shows it (no token hashes)."""
        return {
            "name": self.name,
            "keyspaces": list(self.keyspaces),
            "token_ids": sorted(self.tokens),
        }


@dataclass(frozen=True, slots=True)
class Producer:
    """One producer: its grants, quota, guards and tokens (token id -> TokenInfo)."""

    name: str
    keyspaces: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    quota: Quota = field(default_factory=Quota)
    guards: dict[str, Guard] = field(default_factory=dict)
    tokens: dict[str, TokenInfo] = field(default_factory=dict)

    def prefixes(self) -> tuple[bytes, ...]:
        """Keyspaces as bytes, for `bytes.startswith`."""
        return tuple(k.encode() for k in self.keyspaces)

    def config(self) -> dict[str, Any]:
        """The producer's configuration as the admin API shows it (no token hashes)."""
        return {
            "name": self.name,
            "keyspaces": list(self.keyspaces),
            "shared": list(self.shared),
            "quota": quota_to_dict(self.quota),
            "guards": {k: guard_to_dict(g) for k, g in sorted(self.guards.items())},
            "token_ids": sorted(self.tokens),
        }


def quota_to_dict(q: Quota) -> dict[str, Any]:
    """A quota as JSON-ready dict (every field)."""
    return {
        "ops_per_s": q.ops_per_s,
        "burst": q.burst,
        "bytes_per_s": q.bytes_per_s,
        "bytes_burst": q.bytes_burst,
        "max_delay_ms": q.max_delay_ms,
        "max_bytes_stored": q.max_bytes_stored,
        "shadow": q.shadow,
    }


def guard_to_dict(g: Guard) -> dict[str, Any]:
    """A guard as JSON-ready dict."""
    return {"refuse_empty": g.refuse_empty, "max_deletes_per_batch": g.max_deletes_per_batch}


def overlaps(a: str, b: str) -> bool:
    """Whether keyspaces `a` and `b` share keys (one is a prefix of the other)."""
    return a.startswith(b) or b.startswith(a)


def key_allowed(prefixes: tuple[bytes, ...], key: bytes) -> bool:
    """Whether `key` lies in one of the keyspaces `prefixes`."""
    return bool(prefixes) and key.startswith(prefixes)


def validate_producer(p: Producer) -> None:
    """Raise BadRequestError when a producer's own fields are inconsistent."""
    if not p.name or len(p.name.encode()) > MAX_NAME or "\x00" in p.name:
        raise BadRequestError(f"producer name must be 1 to {MAX_NAME} bytes without NUL")
    for ks in p.keyspaces:
        if not ks or len(ks.encode()) > 500:
            raise BadRequestError(f"keyspace {ks!r} must be 1 to 500 bytes")
    for ks in p.shared:
        if ks not in p.keyspaces:
            raise BadRequestError(f"shared keyspace {ks!r} is not among the keyspaces")
    for ks in p.guards:
        if ks not in p.keyspaces:
            raise BadRequestError(f"guard for {ks!r}, which is not among the keyspaces")
    q = p.quota
    for name in ("ops_per_s", "burst", "bytes_per_s", "bytes_burst", "max_bytes_stored"):
        v = getattr(q, name)
        if v is not None and not v > 0:
            raise BadRequestError(f"quota {name} must be > 0 or null, got {v}")
    if q.max_delay_ms < 0:
        raise BadRequestError("quota max_delay_ms must be >= 0")
    for ks, g in p.guards.items():
        if g.max_deletes_per_batch is not None and g.max_deletes_per_batch < 0:
            raise BadRequestError(f"guard max_deletes_per_batch of {ks!r} must be >= 0")


#: Token holder kinds (`acl.principals.Principal.kind`).
PRODUCER = "producer"
CONSUMER = "consumer"


@dataclass(frozen=True, slots=True)
class Acl:
    """Every producer and consumer, by name. Immutable: changes return a new Acl."""

    producers: dict[str, Producer] = field(default_factory=dict)
    consumers: dict[str, Consumer] = field(default_factory=dict)

    def check_grant(self, p: Producer) -> None:
        """Raise KeyspaceOverlapError when `p`'s keyspaces overlap another producer's
        keyspace and the two are not both marked shared."""
        problems = self.grant_problems(p)
        if problems:
            raise KeyspaceOverlapError(
                problems[0],
                producer=p.name,
                hint="grant a disjoint keyspace, or mark both keyspaces shared",
            )

    def grant_problems(self, p: Producer) -> list[str]:
        """Every overlap of `p`'s keyspaces with another producer's (not both shared)."""
        out = []
        for other in sorted(self.producers.values(), key=lambda o: o.name):
            if other.name == p.name:
                continue
            for mine in p.keyspaces:
                for theirs in other.keyspaces:
                    if overlaps(mine, theirs) and not (mine in p.shared and theirs in other.shared):
                        out.append(
                            f"keyspace {mine!r} of producer {p.name!r} overlaps keyspace "
                            f"{theirs!r} of producer {other.name!r}"
                        )
        return out

    def put(self, p: Producer) -> Acl:
        """Create or update a producer (keeping its tokens); raises on overlap."""
        validate_producer(p)
        self.check_grant(p)
        old = self.producers.get(p.name)
        if old is not None:
            p = replace(p, tokens=dict(old.tokens))
        return replace(self, producers={**self.producers, p.name: p})

    def put_consumer(self, c: Consumer) -> Acl:
        """Create or update a consumer (keeping its tokens)."""
        validate_consumer(c)
        old = self.consumers.get(c.name)
        if old is not None:
            c = replace(c, tokens=dict(old.tokens))
        return replace(self, consumers={**self.consumers, c.name: c})

    def remove(self, name: str) -> Acl:
        """Remove a producer and its tokens (NotFoundError when absent)."""
        self.get(name)
        return replace(self, producers={k: v for k, v in self.producers.items() if k != name})

    def remove_consumer(self, name: str) -> Acl:
        """Remove a consumer and its tokens (NotFoundError when absent)."""
        self.get_consumer(name)
        return replace(self, consumers={k: v for k, v in self.consumers.items() if k != name})

    def add_token(
        self, name: str, token_id: str, token: str, *, kind: str = PRODUCER,
        label: str = "", created_us: int = 0, expires_us: int | None = None,
    ) -> Acl:  # fmt: skip
        """Give producer (or consumer) `name` a new token (stored as its hash only)."""
        info = TokenInfo(hash_token(token), label, created_us, expires_us)
        if kind == CONSUMER:
            c = self.get_consumer(name)
            cs = replace(c, tokens={**c.tokens, token_id: info})
            return replace(self, consumers={**self.consumers, name: cs})
        p = self.get(name)
        ps = replace(p, tokens={**p.tokens, token_id: info})
        return replace(self, producers={**self.producers, name: ps})

    def without_tokens(self, name: str) -> Acl:
        """Producer `name` with every token revoked (NotFoundError when absent)."""
        p = self.get(name)
        return replace(self, producers={**self.producers, name: replace(p, tokens={})})

    def revoke_token(self, name: str, token_id: str, *, kind: str = PRODUCER) -> Acl:
        """Revoke one token of producer (or consumer) `name` (NotFoundError when unknown)."""
        holder: Producer | Consumer = (
            self.get_consumer(name) if kind == CONSUMER else self.get(name)
        )
        if token_id not in holder.tokens:
            raise NotFoundError(f"{kind} {name!r} has no token {token_id!r}", **{kind: name})
        tokens = {k: v for k, v in holder.tokens.items() if k != token_id}
        if isinstance(holder, Consumer):
            return replace(self, consumers={**self.consumers, name: replace(holder, tokens=tokens)})
        return replace(self, producers={**self.producers, name: replace(holder, tokens=tokens)})

    def get(self, name: str) -> Producer:
        """Producer `name` (NotFoundError when absent)."""
        p = self.producers.get(name)
        if p is None:
            raise NotFoundError(f"no producer {name!r}", producer=name)
        return p

    def get_consumer(self, name: str) -> Consumer:
        """Consumer `name` (NotFoundError when absent)."""
        c = self.consumers.get(name)
        if c is None:
            raise NotFoundError(f"no consumer {name!r}", consumer=name)
        return c

    def document(self) -> dict[str, Any]:
        """The ACL as one document without secrets: what `GET /v1/admin/acl` shows and
        `PUT /v1/admin/acl` takes (tokens are managed apart and kept across a PUT)."""
        producers = {}
        for name, p in sorted(self.producers.items()):
            cfg = p.config()
            del cfg["name"], cfg["token_ids"]
            producers[name] = cfg
        consumers = {n: {"keyspaces": list(c.keyspaces)} for n, c in sorted(self.consumers.items())}
        return {"producers": producers, "consumers": consumers}

    def with_document(self, producers: dict[str, Producer], consumers: dict[str, Consumer]) -> Acl:
        """This ACL with its producers and consumers replaced (already validated); those
        that stay keep their tokens, those that go lose theirs."""
        ps = {
            n: replace(p, tokens=dict(self.producers[n].tokens)) if n in self.producers else p
            for n, p in producers.items()
        }
        cs = {
            n: replace(c, tokens=dict(self.consumers[n].tokens)) if n in self.consumers else c
            for n, c in consumers.items()
        }
        return Acl(ps, cs)

    def to_json(self) -> dict[str, Any]:
        """The whole ACL, token hashes included (the stored, replicated document)."""
        return {
            "producers": [
                {**p.config(), "tokens": {k: t.to_json() for k, t in sorted(p.tokens.items())}}
                for p in sorted(self.producers.values(), key=lambda p: p.name)
            ],
            "consumers": [
                {**c.config(), "tokens": {k: t.to_json() for k, t in sorted(c.tokens.items())}}
                for c in sorted(self.consumers.values(), key=lambda c: c.name)
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Acl:
        """Rebuild an Acl from `to_json()` output (or the format-2 one: no consumers,
        tokens as id -> hash)."""
        out = {}
        for d in doc.get("producers", []):
            p = producer_from_config(d["name"], d)
            tokens = {k: TokenInfo.from_json(v) for k, v in d.get("tokens", {}).items()}
            out[p.name] = replace(p, tokens=tokens)
        cons = {}
        for d in doc.get("consumers", []):
            c = consumer_from_config(d["name"], d)
            tokens = {k: TokenInfo.from_json(v) for k, v in d.get("tokens", {}).items()}
            cons[c.name] = replace(c, tokens=tokens)
        return cls(out, cons)


def validate_consumer(c: Consumer) -> None:
    """Raise BadRequestError when a consumer's own fields are inconsistent."""
    if not c.name or len(c.name.encode()) > MAX_NAME or "\x00" in c.name:
        raise BadRequestError(f"consumer name must be 1 to {MAX_NAME} bytes without NUL")
    for ks in c.keyspaces:
        if not ks or len(ks.encode()) > 500:
            raise BadRequestError(f"keyspace {ks!r} must be 1 to 500 bytes")


def given(d: dict[str, Any], name: str, default: Any) -> Any:
    """Field `name` of a configuration, `default` when it is absent or null. Only then:
    a wrong-typed but falsy value (``[]`` for a mapping, ``false``, ``0``, ``""``) is the
    caller's mistake to refuse, never read as "none" (a ``"producers": []`` once read as
    "no producers" would remove them all)."""
    v = d.get(name)
    return default if v is None else v


def consumer_from_config(name: str, d: dict[str, Any]) -> Consumer:
    """Build a consumer from an admin body / document entry; BadRequestError on bad shape."""
    keyspaces = given(d, "keyspaces", [])
    if not isinstance(keyspaces, list) or not all(isinstance(k, str) for k in keyspaces):
        raise BadRequestError(
            f"invalid consumer {name!r}: keyspaces must be a list of strings", consumer=name
        )
    c = Consumer(name=name, keyspaces=tuple(dict.fromkeys(keyspaces)))
    validate_consumer(c)
    return c


def producer_from_config(name: str, d: dict[str, Any]) -> Producer:
    """Build a producer from an admin body / YAML entry; raise BadRequestError on bad shape."""
    try:
        q = given(d, "quota", {})
        if not isinstance(q, dict):
            raise TypeError("quota must be an object")
        unknown = set(q) - set(Quota.__slots__)
        if unknown:
            raise TypeError(f"unknown quota fields {sorted(unknown)}")
        quota = Quota(**{k: v for k, v in q.items() if v is not None})
        if not isinstance(quota.shadow, bool):
            raise TypeError("quota shadow must be a boolean")
        for fname in ("max_delay_ms", "max_bytes_stored"):  # milliseconds, bytes
            v = getattr(quota, fname)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise TypeError(f"quota {fname} must be an integer")
        for fname in ("ops_per_s", "burst", "bytes_per_s", "bytes_burst"):
            v = getattr(quota, fname)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
                raise TypeError(f"quota {fname} must be a number")
        guards_raw = given(d, "guards", {})
        if not isinstance(guards_raw, dict):
            raise TypeError("guards must be an object keyed by keyspace")
        guards = {}
        for ks, g in guards_raw.items():
            if not isinstance(g, dict) or set(g) - {"refuse_empty", "max_deletes_per_batch"}:
                raise TypeError(f"guard of {ks!r} must be {{refuse_empty, max_deletes_per_batch}}")
            guard = Guard(**g)
            if not isinstance(guard.refuse_empty, bool) or not (
                guard.max_deletes_per_batch is None
                or (
                    isinstance(guard.max_deletes_per_batch, int)
                    and not isinstance(guard.max_deletes_per_batch, bool)
                )
            ):
                raise TypeError(f"guard of {ks!r} has fields of the wrong type")
            guards[str(ks)] = guard
        keyspaces = given(d, "keyspaces", [])
        shared = given(d, "shared", [])
        if not isinstance(keyspaces, list) or not all(isinstance(k, str) for k in keyspaces):
            raise TypeError("keyspaces must be a list of strings")
        if not isinstance(shared, list) or not all(isinstance(k, str) for k in shared):
            raise TypeError("shared must be a list of strings")
    except TypeError as err:
        raise BadRequestError(f"invalid producer {name!r}: {err}", producer=name) from err
    p = Producer(
        name=name,
        keyspaces=tuple(dict.fromkeys(keyspaces)),
        shared=tuple(dict.fromkeys(shared)),
        quota=quota,
        guards=guards,
    )
    validate_producer(p)
    return p
