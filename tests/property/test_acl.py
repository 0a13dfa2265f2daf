"""ACL properties: no write outside keyspaces, grants monotone, no unshared overlap."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acl.doc import diff, normalize, steps
from acl.model import Acl, Producer, key_allowed, overlaps, producer_from_config
from core.errors import ForbiddenError, KeyspaceOverlapError
from gateway.settings import Settings
from gateway.writes import Gateway
from store.ops import SET, Op
from store.store import Store

_alpha = st.text(alphabet="ab/", min_size=1, max_size=4)
keyspace_lists = st.lists(_alpha, min_size=0, max_size=4, unique=True)
keys = (
    st.binary(min_size=1, max_size=6)
    .map(lambda b: bytes(x % 3 for x in b))
    .map(lambda b: b.translate(bytes.maketrans(b"\x00\x01\x02", b"ab/")))
)


@given(keyspace_lists, keys)
def test_a_producer_never_writes_outside_its_keyspaces(keyspaces: list[str], key: bytes) -> None:
    p = Producer("p", tuple(keyspaces))
    allowed = key_allowed(p.prefixes(), key)
    assert allowed == any(key.startswith(k.encode()) for k in keyspaces)


@given(keyspace_lists, _alpha, keys)
def test_adding_a_grant_never_removes_access(keyspaces: list[str], extra: str, key: bytes) -> None:
    before = Producer("p", tuple(keyspaces))
    acl = Acl().put(before)
    after = acl.put(
        Producer("p", (*keyspaces, extra) if extra not in keyspaces else tuple(keyspaces))
    )
    if key_allowed(before.prefixes(), key):
        assert key_allowed(after.producers["p"].prefixes(), key)


@given(st.lists(st.tuples(st.sampled_from("pqrs"), keyspace_lists, st.booleans()), max_size=12))
def test_accepted_grants_never_overlap_unless_both_shared(
    steps: list[tuple[str, list[str], bool]],
) -> None:
    acl = Acl()
    for name, keyspaces, shared in steps:
        p = Producer(name, tuple(keyspaces), tuple(keyspaces) if shared else ())
        try:
            acl = acl.put(p)
        except KeyspaceOverlapError:
            continue
    ps = list(acl.producers.values())
    for a in ps:
        for b in ps:
            if a.name >= b.name:
                continue
            for ka in a.keyspaces:
                for kb in b.keyspaces:
                    if overlaps(ka, kb):
                        assert ka in a.shared and kb in b.shared


@given(keyspace_lists, keyspace_lists)
def test_json_round_trip(k1: list[str], k2: list[str]) -> None:
    acl = Acl().put(Producer("a", tuple(k1)))
    with contextlib.suppress(KeyspaceOverlapError):
        acl = acl.put(Producer("b", tuple(k2)))
    acl = acl.add_token("a", "t1", "mct_x")
    assert Acl.from_json(acl.to_json()) == acl


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A Gateway over a real (empty) store; only its pure checks are used."""
    store = Store.create(str(tmp_path_factory.mktemp("acl") / "s"), sync=False)
    try:
        yield Gateway(store, Settings())
    finally:
        store.close()


@given(keyspace_lists, st.lists(keys, min_size=1, max_size=5))
def test_gateway_admits_a_batch_iff_every_key_is_in_a_keyspace(
    gateway: Gateway, keyspaces: list[str], batch_keys: list[bytes]
) -> None:
    p = Producer("p", tuple(keyspaces))
    gateway.auth.rebuild(Acl().put(p))
    ops = [Op(SET, k, b"v", "p") for k in batch_keys]
    inside = all(any(k.startswith(ks.encode()) for ks in keyspaces) for k in batch_keys)
    if inside:
        gateway.check_keys(p, ops)
    else:
        with pytest.raises(ForbiddenError):
            gateway.check_keys(p, ops)


def _acl_of(configs: dict[str, dict[str, object]]) -> Acl:
    acl = Acl()
    for name, cfg in configs.items():
        acl = acl.put(producer_from_config(name, cfg))
    return acl


@st.composite
def valid_acls(draw: st.DrawFn) -> dict[str, dict[str, object]]:
    """Normalized configs of producers p..s whose keyspaces never overlap."""
    acl = Acl()
    for name in "pqrs":
        if draw(st.booleans()):
            ks = draw(keyspace_lists)
            shared = tuple(k for k in ks if draw(st.booleans()))
            with contextlib.suppress(KeyspaceOverlapError):
                acl = acl.put(Producer(name, tuple(ks), shared))
    return {n: normalize(n, p.config()) for n, p in acl.producers.items()}


@settings(max_examples=300)
@given(valid_acls(), valid_acls())
def test_acl_apply_steps_never_pass_through_an_overlap(
    current: dict[str, dict[str, object]], desired: dict[str, dict[str, object]]
) -> None:
    """Any valid ACL turns into any other valid ACL by `doc.steps` without a refused step,
    and ends equal to the desired one (keyspaces moved between producers included)."""
    check_steps(current, desired)


def test_acl_apply_steps_swap_keyspaces() -> None:
    """The case a naive order (removals, updates, creations) refuses: two producers swap."""
    check_steps(
        {"p": normalize("p", {"keyspaces": ["a"]}), "q": normalize("q", {"keyspaces": ["b"]})},
        {"p": normalize("p", {"keyspaces": ["b"]}), "q": normalize("q", {"keyspaces": ["a/x"]})},
    )


def check_steps(
    current: dict[str, dict[str, object]], desired: dict[str, dict[str, object]]
) -> None:
    acl = _acl_of(current)
    for name, cfg in steps(current, diff(current, desired)):
        acl = acl.remove(name) if cfg is None else acl.put(producer_from_config(name, cfg))
    assert {n: normalize(n, p.config()) for n, p in acl.producers.items()} == desired
