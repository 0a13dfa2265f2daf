"""The store behaves like a dict (plus versions and usage), across close and reopen."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from store.ops import SET, Op, Status
from store.store import Store
from store.usage import Usage
from tests.conftest import assert_store_ok
from tests.strategies import store_ops


class StoreVsDict(RuleBasedStateMachine):
    """Model: key -> (value, version, owner); the store must agree after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="mercury-model-")
        self.store = Store.create(self.dir + "/s", sync=False, map_size=1 << 28)
        self.model: dict[bytes, tuple[bytes, int, str]] = {}
        self.seq = 0

    @rule(batch=st.lists(store_ops(), max_size=8))
    def apply(self, batch: list[Op]) -> None:
        r = self.store.apply(batch)
        for op, res in zip(batch, r.results, strict=True):
            cur = self.model.get(op.key)
            version = cur[1] if cur else 0
            if op.expect_seq is not None and op.expect_seq != version:
                assert res.status is Status.PRECONDITION_FAILED and res.seq == version
            elif op.op == SET:
                if cur is not None and cur[0] == op.value:
                    assert res.status is Status.DUPLICATE and res.seq == version
                else:
                    self.seq += 1
                    assert res.status is Status.WRITTEN and res.seq == self.seq
                    self.model[op.key] = (op.value, self.seq, op.owner)
            elif cur is None:
                assert res.status is Status.ABSENT
            else:
                self.seq += 1
                assert res.status is Status.DELETED and res.seq == self.seq
                del self.model[op.key]
        assert self.store.last_seq() == self.seq

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = Store.open(self.dir + "/s", sync=False, map_size=1 << 28)

    @rule(keep=st.integers(min_value=0, max_value=10))
    def gc(self, keep: int) -> None:
        self.store.gc_log(keep_entries=keep)

    @invariant()
    def agrees_with_model(self) -> None:
        with self.store.reader() as r:
            got = {k: (v.value, v.seq, v.owner) for k, v in r.scan() if v is not None}
        assert got == self.model
        usage = self.store.usage()
        for owner in ("", "alice", "bob"):
            keys = sum(1 for v in self.model.values() if v[2] == owner)
            assert usage.get(owner, Usage()).keys == keys

    def teardown(self) -> None:
        try:
            assert_store_ok(self.store)
        finally:
            self.store.close()
            shutil.rmtree(self.dir, ignore_errors=True)


TestStoreVsDict = StoreVsDict.TestCase
TestStoreVsDict.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
