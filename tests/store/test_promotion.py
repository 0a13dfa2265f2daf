"""`store.promotion.promote`: a replica's store continues the same history as a root's."""

from __future__ import annotations

import json
from pathlib import Path

from store.ops import SET, Op
from store.promotion import last_promotion, promote
from store.store import Store
from tests.conftest import assert_store_ok


def test_promote_logs_where_the_history_went_on_and_the_chain_continues(tmp_path: Path) -> None:
    root = Store.create(str(tmp_path / "root"), sync=False)
    rep = Store.create(str(tmp_path / "rep"), db_id=root.db_id, sync=False)
    other = Store.create(str(tmp_path / "other"), db_id=root.db_id, sync=False)
    try:
        root.put_docs({"admin_token_hash": b"h", "acl": b"{}"})
        root.apply([Op(SET, b"a/1", b"v", "p")], answers=lambda _r: [(b"ip\x00k", b"ans")])
        for r in (rep, other):
            r.apply_log_records(root.read_log(1))
        seq, head = rep.head()
        assert last_promotion(rep) is None

        done = promote(rep, time_us=5, extra={"term": 7})
        assert (done.after_seq, done.after_hash, done.seq) == (seq, head.hex(), seq + 1)
        assert done.has_admin and done.has_acl
        doc = last_promotion(rep)
        assert doc == {"after_seq": seq, "after_hash": head.hex(), "promoted_us": 5, "term": 7,
                       "seq": seq + 1}  # fmt: skip
        assert json.loads(done.to_json())["seq"] == seq + 1

        # the promoted store takes batches; a replica of the old root follows it, no gap
        rep.apply([Op(SET, b"a/2", b"w", "p")])
        other.apply_log_records(rep.read_log(seq + 1))
        assert other.head() == rep.head() and other.get(b"a/2") is not None
        assert other.get_idempotent(b"ip\x00k") == rep.get_idempotent(b"ip\x00k") is not None
        assert_store_ok(rep)
        assert_store_ok(other)
    finally:
        for s in (root, rep, other):
            s.close()


def test_promote_says_when_the_store_lacks_what_a_root_needs(tmp_path: Path) -> None:
    with Store.create(str(tmp_path / "s"), sync=False) as s:
        done = promote(s)
        assert not done.has_admin and not done.has_acl and done.seq == 1
