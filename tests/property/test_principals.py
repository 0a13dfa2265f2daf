"""The token resolver (`acl.principals`): one bearer parser, one expiry rule, one lookup.

Properties over generated ACLs, clocks and header spellings: a token is refused from its
expiry's own microsecond on; a revoked or never-issued token is unknown (never "expired");
the admin token is everyone's keyspaces and never expires; a consumer's and a producer's
token resolve to their own kind, name and keyspaces; and the parser takes every spelling
the two parsers it replaced took, the same way (their code is kept here as the oracle).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from acl.model import CONSUMER, PRODUCER, Acl, Consumer, Producer
from acl.principals import (
    ADMIN,
    EVERYTHING,
    Principal,
    Refusal,
    TokenResolver,
    bearer_token,
    expired,
)
from acl.tokens import hash_token

ADMIN_TOKEN = "mct_admin-secret"

# Tokens as HTTP carries them: Latin-1 text (headers are decoded so), without the
# surrounding whitespace the parser strips. Non-ASCII letters included on purpose.
_TOKEN_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0xFF).filter(
    lambda c: not c.isspace()
)
tokens = st.text(_TOKEN_CHARS, min_size=1, max_size=20).map(lambda t: "mct_" + t)
micros = st.integers(min_value=0, max_value=2**62)
kinds = st.sampled_from([PRODUCER, CONSUMER])
keyspaces = st.lists(st.text("ab/é", min_size=1, max_size=4), max_size=3, unique=True)


def _acl(kind: str, name: str, spaces: list[str], token: str, expires_us: int | None) -> Acl:
    if kind == CONSUMER:
        acl = Acl().put_consumer(Consumer(name, tuple(spaces)))
    else:
        acl = Acl().put(Producer(name, tuple(spaces)))
    return acl.add_token(name, "tok_1", token, kind=kind, expires_us=expires_us)


@given(tokens, micros, st.integers(min_value=-3, max_value=3), kinds)
def test_a_token_is_refused_from_its_expiry_microsecond_on(
    token: str, expires_us: int, delta: int, kind: str
) -> None:
    resolver = TokenResolver(_acl(kind, "p", ["a/"], token, expires_us))
    now = max(0, expires_us + delta)
    got = resolver.resolve_token(token, now)
    if now >= expires_us:
        assert got is Refusal.EXPIRED
        assert expired(expires_us, now)
    else:
        assert isinstance(got, Principal) and got.expires_us == expires_us
        assert not expired(expires_us, now)


@given(tokens, micros)
def test_a_token_without_expiry_never_expires(token: str, now: int) -> None:
    resolver = TokenResolver(_acl(PRODUCER, "p", ["a/"], token, None))
    assert isinstance(resolver.resolve_token(token, now), Principal)
    assert not expired(None, now)


@given(tokens, tokens, st.one_of(st.none(), micros), micros)
def test_revoked_and_never_issued_tokens_are_unknown(
    token: str, other: str, expires_us: int | None, now: int
) -> None:
    acl = _acl(PRODUCER, "p", ["a/"], token, expires_us)
    if other != token:
        assert TokenResolver(acl).resolve_token(other, now) is Refusal.UNKNOWN
    revoked = TokenResolver(acl.revoke_token("p", "tok_1"))
    # Revocation wins over expiry: a revoked token is unknown, whatever its expiry was.
    assert revoked.resolve_token(token, now) is Refusal.UNKNOWN
    gone = TokenResolver(acl.remove("p"))
    assert gone.resolve_token(token, now) is Refusal.UNKNOWN


@given(tokens, micros, kinds)
def test_the_admin_token_reads_everything_and_never_expires(
    token: str, now: int, kind: str
) -> None:
    acl = _acl(kind, "p", ["a/"], token, 1)  # the ACL's token long expired
    resolver = TokenResolver(acl, hash_token(ADMIN_TOKEN))
    got = resolver.resolve_token(ADMIN_TOKEN, now)
    assert isinstance(got, Principal)
    assert (got.kind, got.keyspaces, got.expires_us, got.token_id) == (
        ADMIN,
        EVERYTHING,
        None,
        None,
    )
    assert resolver.resolve(f"Bearer {ADMIN_TOKEN}", now) == got
    # No admin token, or a rotated one: the old admin token is unknown.
    assert TokenResolver(acl).resolve_token(ADMIN_TOKEN, now) is Refusal.UNKNOWN
    rotated = resolver.with_admin_hash(hash_token(ADMIN_TOKEN + "x"))
    assert rotated.resolve_token(ADMIN_TOKEN, now) is Refusal.UNKNOWN
    assert rotated.resolve_token(ADMIN_TOKEN + "x", now) == got
    # Rotation keeps the ACL's tokens as they were.
    assert rotated.resolve_token(token, now) == resolver.resolve_token(token, now)


@given(tokens, tokens, keyspaces, keyspaces, micros)
def test_consumers_and_producers_resolve_to_their_own_kind_and_keyspaces(
    ptoken: str, ctoken: str, pspaces: list[str], cspaces: list[str], now: int
) -> None:
    acl = Acl().put(Producer("p", tuple(pspaces))).put_consumer(Consumer("c", tuple(cspaces)))
    acl = acl.add_token("p", "tok_p", ptoken, expires_us=now + 1)
    acl = acl.add_token("c", "tok_c", ctoken, kind=CONSUMER)
    resolver = TokenResolver(acl, hash_token(ADMIN_TOKEN))
    p = resolver.resolve_token(ptoken, now)
    c = resolver.resolve_token(ctoken, now)
    if ptoken == ctoken:  # one hash held twice: the producer's, as the index always had it
        assert p == c and isinstance(p, Principal) and p.kind == PRODUCER
        return
    assert p == Principal(PRODUCER, "p", tuple(k.encode() for k in pspaces), now + 1, "tok_p")
    assert c == Principal(CONSUMER, "c", tuple(k.encode() for k in cspaces), None, "tok_c")
    assert p.keyspaces == acl.producers["p"].prefixes()


def _gateway_parser(header: str | None) -> str | None:
    """The gateway's bearer parser before the resolver (`Auth.authenticate`)."""
    if not header or header[:7].lower() != "bearer ":
        return None
    return header[7:].strip()


def _reads_parser(header: bytes) -> str | None:
    """The read middleware's parser before the resolver (`reads.auth.bearer`)."""
    scheme, _, token = header.decode("latin-1").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


@st.composite
def bearer_headers(draw: st.DrawFn) -> tuple[bytes, str]:
    """A Bearer header in any spelling, and the token it carries."""
    scheme = "".join(c.upper() if draw(st.booleans()) else c for c in "bearer")
    token = draw(st.one_of(tokens, st.just("")))
    gap = " " * draw(st.integers(min_value=1, max_value=4))
    tail = draw(st.sampled_from(["", " ", "  ", "\t", " \t "]))
    return f"{scheme}{gap}{token}{tail}".encode("latin-1"), token


# Any header at all: spellings of the scheme, other schemes, no space, tabs, controls,
# non-ASCII bytes, empty.
any_header = st.one_of(
    bearer_headers().map(lambda ht: ht[0]),
    st.binary(max_size=24),
    st.builds(
        lambda a, b: a.encode() + b,
        st.sampled_from(["Bearer", "bearer\t", "Basic ", "Bearer:", " Bearer ", "Bearerx ", ""]),
        st.binary(max_size=12),
    ),
)


@given(bearer_headers())
def test_every_spelling_of_bearer_gives_its_token(header_token: tuple[bytes, str]) -> None:
    header, token = header_token
    assert bearer_token(header) == token
    assert bearer_token(header.decode("latin-1")) == token


@given(any_header)
def test_the_one_parser_reads_every_header_as_both_old_parsers_did(header: bytes) -> None:
    text = header.decode("latin-1")
    got = bearer_token(header)
    assert got == bearer_token(text) == _gateway_parser(text)
    # The read side treated "no token" and "an empty token" alike (both refused 401).
    assert (got or None) == _reads_parser(header)


@given(any_header, micros, tokens)
def test_a_header_resolves_as_its_token(header: bytes, now: int, token: str) -> None:
    acl = _acl(PRODUCER, "p", ["a/"], token, None)
    resolver = TokenResolver(acl, hash_token(ADMIN_TOKEN))
    parsed = bearer_token(header)
    got = resolver.resolve(header, now)
    assert got == resolver.resolve(header.decode("latin-1"), now)
    if parsed is None:
        assert got is Refusal.MISSING
    else:
        assert got == resolver.resolve_token(parsed, now)
    if parsed == "":
        assert got is Refusal.UNKNOWN  # "Bearer " names a token no one holds


@given(tokens, micros)
def test_a_non_ascii_token_resolves_from_raw_bytes_and_from_decoded_text(
    token: str, now: int
) -> None:
    token += "é\xff"  # bytes E9 FF on the wire: never UTF-8, always Latin-1
    resolver = TokenResolver(_acl(CONSUMER, "c", ["a/"], token, None))
    raw = b"Bearer " + token.encode("latin-1")
    got = resolver.resolve(raw, now)
    assert isinstance(got, Principal) and got.name == "c"
    assert resolver.resolve(raw.decode("latin-1"), now) == got
    assert resolver.resolve(None, now) is Refusal.MISSING
    assert resolver.resolve(b"", now) is Refusal.MISSING
