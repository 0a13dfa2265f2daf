"""Every surface that takes a bearer token resolves it the same way (`acl.principals`).

One ACL and one clock, real objects over a real store: the gateway's `Auth` (writes,
admin calls, the root's point GET), the root's read tokens with and without
``--read-auth`` (`GatewayReadTokens`), a replica's `AclTokenIndex` (over the replicated
ACL document), and the read middleware `ReadAuth` (reads and watch; its header parsing is
the fast point-get path's too) in front of each index. For any header and any instant
around a token's expiry, each caller's answer is the resolver's principal put through
that caller's own policy — so none of them parses, looks up or expires a token its own
way: a caller that did would disagree on some header or at the expiry microsecond.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette

from acl.model import CONSUMER, DOC_NAME, Acl, Consumer, Producer
from acl.principals import ADMIN as ADMIN_KIND
from acl.principals import Principal, Refusal, TokenResolver
from acl.tokens import hash_token
from core.errors import AuthError, ForbiddenError
from gateway.auth import ADMIN
from gateway.read_tokens import GatewayReadTokens
from gateway.settings import Settings
from gateway.writes import Gateway
from reads.auth import AclTokenIndex, ReadAuth, TokenIndex, bearer
from reads.ranges import READ_KEYSPACES
from store.docs import ADMIN_HASH
from store.store import Store

EXPIRES_US = 1_800_000_000_000_000
TOKENS = {
    "producer": "mct_producer-live",
    "expiring": "mct_producer-expiring",
    "consumer": "mct_consumer-café",  # non-ASCII: é is one Latin-1 byte on the wire
    "expiring-consumer": "mct_consumer-expiring",
    "revoked": "mct_revoked",
    "admin": "mct_admin",
    "unknown": "mct_never-issued",
    "empty": "",
}


def _acl() -> Acl:
    acl = Acl().put(Producer("p", ("app/", "shared/"))).put_consumer(Consumer("c", ("app/a/",)))
    acl = acl.add_token("p", "tok_live", TOKENS["producer"])
    acl = acl.add_token("p", "tok_exp", TOKENS["expiring"], expires_us=EXPIRES_US)
    acl = acl.add_token("c", "tok_c", TOKENS["consumer"], kind=CONSUMER)
    acl = acl.add_token(
        "c", "tok_cexp", TOKENS["expiring-consumer"], kind=CONSUMER, expires_us=EXPIRES_US
    )
    acl = acl.add_token("p", "tok_rev", TOKENS["revoked"])
    return acl.revoke_token("p", "tok_rev")


class Callers:
    """The real callers over one store holding the ACL and the admin token's hash."""

    def __init__(self, store: Store) -> None:
        self.now = 0
        self.gw = Gateway(store, Settings())  # loads both documents, as at start
        self.gw.auth.clock = lambda: self.now
        app = Starlette()
        app.state.gw = self.gw
        self.root_reads = GatewayReadTokens(app)
        self.root_watch = GatewayReadTokens(app, consumers=False)
        self.replica = AclTokenIndex(store, clock=lambda: self.now)


@pytest.fixture(scope="module")
def callers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callers]:
    store = Store.create(str(tmp_path_factory.mktemp("tokens") / "s"), sync=False)
    store.put_docs(
        {
            DOC_NAME: json.dumps(_acl().to_json()).encode(),
            ADMIN_HASH: hash_token(TOKENS["admin"]).encode(),
        }
    )
    try:
        yield Callers(store)
    finally:
        store.close()


def _gateway(c: Callers, header: str | None) -> tuple[str, str]:
    try:
        return "ok", c.gw.auth.authenticate(header)
    except AuthError as err:
        return "401", err.message
    except ForbiddenError as err:
        return "403", err.message


def _middleware(index: TokenIndex, header: bytes | None, *more: bytes) -> tuple[int, Any]:
    """The status `ReadAuth` answers for a whole-keyspace range (200: passed on), and the
    keyspaces it passed on with the request; `more`: further Authorization headers."""
    seen: list[Any] = []
    sent: list[MutableMapping[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope.get(READ_KEYSPACES))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: MutableMapping[str, Any]) -> None:
        sent.append(msg)

    headers = [(b"host", b"x")] + ([(b"authorization", header)] if header is not None else [])
    headers += [(b"authorization", h) for h in more]
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/range",
        "raw_path": b"/v1/range",
        "query_string": b"",
        "headers": headers,
    }
    asyncio.run(ReadAuth(app, index)(scope, receive, send))
    return sent[0]["status"], (seen[0] if seen else None)


@st.composite
def headers(draw: st.DrawFn) -> bytes | None:
    """A header naming one of TOKENS in any spelling of the scheme, or no usable header."""
    token = TOKENS[draw(st.sampled_from(sorted(TOKENS)))]
    scheme = "".join(c.upper() if draw(st.booleans()) else c for c in "bearer")
    spelled = f"{scheme}{' ' * draw(st.integers(1, 3))}{token}{draw(st.sampled_from(['', ' ']))}"
    return draw(
        st.sampled_from([spelled.encode("latin-1"), None, b"", b"Basic " + token.encode("latin-1")])
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(headers(), st.sampled_from([0, EXPIRES_US - 1, EXPIRES_US, EXPIRES_US + 1]))
def test_every_caller_answers_what_the_one_resolver_resolves(
    callers: Callers, header: bytes | None, now: int
) -> None:
    callers.now = now
    auth = callers.gw.auth
    resolver = TokenResolver(_acl(), hash_token(TOKENS["admin"]))
    who = resolver.resolve(header, now)
    text = header.decode("latin-1") if header is not None else None

    # The gateway: 401 worded by refusal, 403 for a consumer, the producer or ADMIN.
    auth.last_used.clear()
    got = _gateway(callers, text)
    if who is Refusal.MISSING:
        assert got == ("401", "missing bearer token")
    elif who is Refusal.EXPIRED:
        assert got == ("401", "expired token")
    elif who is Refusal.UNKNOWN:
        assert got == ("401", "unknown or revoked token")
    else:
        assert isinstance(who, Principal)
        if who.kind == CONSUMER:
            assert got[0] == "403" and "consumer tokens read from replicas" in got[1]
        else:
            assert got == ("ok", ADMIN if who.kind == ADMIN_KIND else who.name)
    tid = who.token_id if isinstance(who, Principal) else None
    used = {tid: now} if tid is not None else {}
    # Last use: every accepted ACL token (a consumer's too, refused after), never the admin.
    assert auth.last_used == used

    keyspaces = who.keyspaces if isinstance(who, Principal) else None
    # The root with --read-auth: every principal reads its keyspaces.
    auth.last_used.clear()
    assert _middleware(callers.root_reads, header) == (
        (200, keyspaces) if keyspaces is not None else (401, None)
    )
    assert auth.last_used == used

    # The root's watch without --read-auth: consumers' tokens are not taken there.
    auth.last_used.clear()
    is_consumer = isinstance(who, Principal) and who.kind == CONSUMER
    root_watch = None if is_consumer else keyspaces
    assert _middleware(callers.root_watch, header) == (
        (200, root_watch) if root_watch is not None else (401, None)
    )
    assert auth.last_used == ({} if is_consumer else used)

    # A replica: the ACL's tokens only (the admin token is the root's), no last use kept.
    replica = None if isinstance(who, Principal) and who.kind == ADMIN_KIND else keyspaces
    assert _middleware(callers.replica, header) == (
        (200, replica) if replica is not None else (401, None)
    )


def test_each_token_resolves_as_documented(callers: Callers) -> None:
    """The examples above, spelled out once: what each token is on each surface."""
    callers.now = EXPIRES_US
    h = {name: f"Bearer {t}" for name, t in TOKENS.items()}
    assert _gateway(callers, h["producer"]) == ("ok", "p")
    assert _gateway(callers, h["expiring"]) == ("401", "expired token")
    assert _gateway(callers, h["consumer"])[0] == "403"
    assert _gateway(callers, h["revoked"]) == ("401", "unknown or revoked token")
    assert _gateway(callers, h["empty"]) == ("401", "unknown or revoked token")
    assert _gateway(callers, h["admin"]) == ("ok", ADMIN)
    assert _gateway(callers, None) == ("401", "missing bearer token")
    raw = {name: v.encode("latin-1") for name, v in h.items()}
    assert _middleware(callers.root_reads, raw["admin"]) == (200, (b"",))
    assert _middleware(callers.replica, raw["admin"]) == (401, None)
    assert _middleware(callers.replica, raw["consumer"]) == (200, (b"app/a/",))
    assert _middleware(callers.root_watch, raw["consumer"]) == (401, None)
    assert _middleware(callers.replica, raw["producer"]) == (200, (b"app/", b"shared/"))
    callers.now = EXPIRES_US - 1
    assert _gateway(callers, h["expiring"]) == ("ok", "p")
    assert _middleware(callers.replica, raw["expiring-consumer"]) == (200, (b"app/a/",))


def test_the_first_authorization_header_is_the_one_read(callers: Callers) -> None:
    """Authorization is not a list header: of several, every surface reads the first, as
    the gateway always did (the read middleware once took the first Bearer one)."""
    callers.now = 0
    good = f"Bearer {TOKENS['producer']}".encode()
    for first in (b"Basic x", b"Bearer ", b"Bearer mct_never-issued"):
        headers = [(b"authorization", first), (b"authorization", good)]
        assert bearer({"headers": headers}) == bearer({"headers": headers[:1]})
        assert _gateway(callers, first.decode())[0] == "401"
        assert _middleware(callers.replica, first, good) == (401, None)
    assert _middleware(callers.replica, good, b"Basic x") == (200, (b"app/", b"shared/"))
