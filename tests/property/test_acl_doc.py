"""PUT /v1/admin/acl is all or nothing: for random ACL documents and random invalid edits, a
rejected PUT leaves the stored (replicated) document byte-identical and the log untouched.

A real root process answers over HTTP; the test reads the stored document from the same
LMDB environment read-only (another process, as a replica's readers do).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acl.doc import check_document, document_diff
from acl.model import Acl
from store.store import Store
from testkit.procs import Procs
from tests.gateway.conftest import make_root

_names = st.text(alphabet="abcxyz", min_size=1, max_size=3)
_keyspace = st.text(alphabet="ab/", min_size=1, max_size=4)
_producer = st.fixed_dictionaries(
    {"keyspaces": st.lists(_keyspace, max_size=3, unique=True)},
    optional={
        "quota": st.fixed_dictionaries(
            {}, optional={"ops_per_s": st.integers(1, 1000), "shadow": st.booleans()}
        )
    },
)
documents = st.fixed_dictionaries(
    {
        "producers": st.dictionaries(_names, _producer, max_size=4),
        "consumers": st.dictionaries(
            _names,
            st.fixed_dictionaries({"keyspaces": st.lists(_keyspace, max_size=2)}),
            max_size=2,
        ),
    }
)

#: Edits that make any document invalid, each in its own way.
INVALID_EDITS = (
    "unknown_member",
    "producer_not_object",
    "unknown_producer_field",
    "bad_quota",
    "shared_not_granted",
    "overlap",
    "consumer_bad_keyspaces",
    "empty_keyspace",
)


def invalidate(doc: dict[str, Any], how: str, name: str) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    ps, cs = d["producers"], d["consumers"]
    if how == "unknown_member":
        d["owners"] = {}
    elif how == "producer_not_object":
        ps[name] = ["k/"]
    elif how == "unknown_producer_field":
        ps[name] = {"keyspaces": ["q/"], "colour": "red"}
    elif how == "bad_quota":
        ps[name] = {"keyspaces": ["q/"], "quota": {"ops_per_s": -1}}
    elif how == "shared_not_granted":
        ps[name] = {"keyspaces": ["q/"], "shared": ["r/"]}
    elif how == "overlap":
        ps[name + "1"] = {"keyspaces": ["zz/"]}
        ps[name + "2"] = {"keyspaces": ["zz/y"]}
    elif how == "consumer_bad_keyspaces":
        cs[name] = {"keyspaces": "zz/"}
    elif how == "empty_keyspace":
        ps[name] = {"keyspaces": [""]}
    return d


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Store]]:
    tmp = tmp_path_factory.mktemp("acldoc")
    (tmp / "logs").mkdir()
    procs = Procs(tmp / "logs")
    try:
        root = make_root(procs, tmp / "data", window_ms=1)
        client = root.admin()
        with Store.open(str(tmp / "data"), readonly=True) as store:
            yield client, store
        root.close_clients()
    finally:
        procs.stop_all()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(documents, st.sampled_from(INVALID_EDITS), _names, st.booleans())
def test_a_rejected_put_leaves_the_document_byte_identical(
    app: tuple[httpx.Client, Store], doc: dict[str, Any], how: str, name: str, stale: bool
) -> None:
    client, store = app
    etag = client.get("/v1/admin/acl").headers["etag"]
    r = client.put("/v1/admin/acl", json=doc, headers={"If-Match": etag})
    assert r.status_code in (200, 422), r.text  # a random document may overlap itself
    etag = client.get("/v1/admin/acl").headers["etag"]
    before, head = store.get_doc("acl"), store.head()

    bad = invalidate(doc, how, name)
    if stale:  # a valid version that is not the current one
        r = client.put("/v1/admin/acl", json=doc, headers={"If-Match": '"999999999"'})
        assert r.status_code == 412, r.text
    r = client.put("/v1/admin/acl", json=bad, headers={"If-Match": etag})
    assert r.status_code == 422, (how, r.text)
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["errors"], r.text
    r = client.put("/v1/admin/acl?dry_run=true", json=bad, headers={"If-Match": etag})
    assert r.status_code == 422, r.text
    assert store.get_doc("acl") == before  # bytes and version
    assert store.head() == head  # nothing logged
    assert client.get("/v1/admin/acl").headers["etag"] == etag


@given(documents, documents)
def test_document_round_trip_and_diff(doc: dict[str, Any], other: dict[str, Any]) -> None:
    """A valid document survives check -> Acl -> document unchanged in meaning (checking
    it again finds nothing and diffs empty), and a diff is empty iff documents are equal."""
    ps, cs, errors = check_document(doc)
    if errors:
        return
    shown = Acl().with_document(ps, cs).document()
    ps2, cs2, errors2 = check_document(shown)
    assert errors2 == [] and Acl().with_document(ps2, cs2).document() == shown
    assert document_diff(shown, shown) == []
    ps3, cs3, errors3 = check_document(other)
    if not errors3:
        shown3 = Acl().with_document(ps3, cs3).document()
        assert (document_diff(shown, shown3) == []) == (shown == shown3)


@pytest.mark.parametrize("falsy", [[], False, 0, "", ()], ids=repr)
def test_a_wrong_typed_falsy_member_is_a_problem_never_none(falsy: Any) -> None:
    """Only an absent or null member means "none": ``"producers": []`` once read as an
    empty document, and its PUT removed every producer (200, not 422)."""
    for doc in ({"producers": falsy}, {"consumers": falsy}):
        _, _, errors = check_document(doc)
        assert errors, doc
    for field in ("keyspaces", "shared", "quota", "guards"):
        if isinstance(falsy, list | tuple) and field in ("keyspaces", "shared"):
            continue  # an empty list of keyspaces is the right type: none
        _, _, errors = check_document({"producers": {"p": {"keyspaces": ["p/"], field: falsy}}})
        assert errors, (field, falsy)
    assert check_document({"producers": None, "consumers": None})[2] == []


def test_a_producer_with_an_unknown_field_still_has_its_other_problems_listed() -> None:
    doc = {
        "producers": {
            "a": {"keyspaces": ["k/"]},
            "b": {"keyspaces": ["k/sub/"], "quota": {"ops_per_s": -1}, "colour": "red"},
        }
    }
    _, _, errors = check_document(doc)
    assert any("unknown fields" in e for e in errors), errors
    assert any("ops_per_s" in e for e in errors), errors
    assert any("overlaps" in e for e in errors), errors


@pytest.mark.parametrize(
    "quota",
    [{"max_delay_ms": True}, {"max_bytes_stored": 1.5}, {"max_delay_ms": 2.5}, {"shadow": 1}],
    ids=repr,
)
def test_quota_fields_of_the_wrong_type_are_refused(quota: dict[str, Any]) -> None:
    _, _, errors = check_document({"producers": {"p": {"keyspaces": ["p/"], "quota": quota}}})
    assert errors, quota
