"""The cache node's rules (`cache/state.py`: eviction policy + consistency) against a model
of a root, its history and a source answering misses at any seq it may read at.

Hypothesis drives writes, the invalidation stream, misses whose answers arrive in any
order, hits, evictions (a budget of a few entries), source restarts (answers in flight
lost or delivered late; a source that lost the history restarts the stream) and warm
restarts of the node, and checks at every value served:

- it is the key's value at the seq the answer was read at (the source is truthful);
- no value is served after the cache applied the seq that replaced or deleted it;
- monotonic reads: per key, what is served never goes back to an older change.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cache.policy import ENTRY_OVERHEAD
from cache.rules import Install
from cache.state import CacheState, Held

KEYS = [b"a", b"b", b"c", b"d", b"e"]
#: About three small entries: evictions happen all the time.
BUDGET = 3 * (ENTRY_OVERHEAD + 1 + 4)


class CacheVsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        #: The root's history: (seq, key, value or None for a delete), in seq order.
        self.history: dict[bytes, list[tuple[int, bytes | None]]] = {k: [] for k in KEYS}
        #: Records as (last seq, [(seq, key)]) in order; `self.next_rec` is the next to apply.
        self.records: list[tuple[int, list[tuple[int, bytes]]]] = []
        self.next_rec = 0
        self.root_seq = 0
        self.state = CacheState(BUDGET, recent_keys=3)
        #: The node's store: key -> (value or None, version).
        self.store: dict[bytes, tuple[bytes | None, int]] = {}
        #: Answers in flight: (key, read seq, value, version).
        self.pending: list[tuple[bytes, int, bytes | None, int]] = []
        #: Per key, the change seq of the last value served (monotonic reads).
        self.served: dict[bytes, int] = {}
        self.n_served = 0

    # --- the model's truth ---------------------------------------------------------

    def truth(self, key: bytes, at: int) -> tuple[bytes | None, int, int]:
        """(value, version, seq of the last change) of `key` as of seq `at`."""
        value, version, change = None, 0, 0
        for seq, v in self.history[key]:
            if seq > at:
                break
            value, version, change = v, (seq if v is not None else 0), seq
        return value, version, change

    def check_served(self, key: bytes, read_seq: int, value: bytes | None, version: int) -> None:
        want, want_version, change = self.truth(key, read_seq)
        assert (value, version) == (want, want_version), "not the value at its read seq"
        for seq, _v in self.history[key]:
            if read_seq < seq <= self.state.applied:
                raise AssertionError(
                    f"served {key!r} read at {read_seq} after applying its change at {seq}"
                )
        assert change >= self.served.get(key, 0), f"{key!r} went back in time"
        self.served[key] = change
        self.n_served += 1

    # --- rules ---------------------------------------------------------------------

    @rule(
        changes=st.lists(
            st.tuples(st.sampled_from(KEYS), st.none() | st.binary(min_size=1, max_size=4)),
            min_size=1,
            max_size=3,
        )
    )
    def write(self, changes: list[tuple[bytes, bytes | None]]) -> None:
        rec = []
        for key, value in changes:
            self.root_seq += 1
            self.history[key].append((self.root_seq, value))
            rec.append((self.root_seq, key))
        self.records.append((self.root_seq, rec))

    @precondition(lambda self: self.next_rec < len(self.records))
    @rule()
    def invalidation(self) -> None:
        last, changes = self.records[self.next_rec]
        self.next_rec += 1
        for k in self.state.invalidate(last, changes):
            del self.store[k]

    @rule(key=st.sampled_from(KEYS), data=st.data())
    def read(self, key: bytes, data: st.DataObject) -> None:
        held = self.state.lookup(key)
        if held is not None:
            value, version = self.store[key]
            assert (value is None) == held.negative and version == held.version
            self.check_served(key, held.read_seq, value, version)
            return
        low = self.state.rules.horizon
        if low > self.root_seq:
            return  # no source can answer yet (it waits, or the node answers 503)
        # A source at the horizon, at the root's head, or anywhere between.
        read_seq = data.draw(
            st.sampled_from([low, self.root_seq])
            | st.integers(min_value=low, max_value=self.root_seq)
        )
        value, version, _ = self.truth(key, read_seq)
        self.pending.append((key, read_seq, value, version))

    @precondition(lambda self: bool(self.pending))
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(min_value=0, max_value=len(self.pending) - 1))
        key, read_seq, value, version = self.pending.pop(i)
        out = self.state.answer(key, read_seq, value, version)
        for k in out.delete:
            del self.store[k]
        if out.decision is Install.STALE:
            return  # the node asks again at the horizon
        if out.decision is Install.KEEP:
            held = self.state.held[key]
            value, version = self.store[key]
            self.check_served(key, held.read_seq, value, version)
            return
        if out.put:
            self.store[key] = (value, version)
        self.check_served(key, read_seq, value, version)

    @rule(lose_answers=st.booleans(), history_lost=st.booleans())
    def source_restart(self, lose_answers: bool, history_lost: bool) -> None:
        if lose_answers:
            self.pending.clear()
        if history_lost:
            # The new source no longer holds the records after `applied`: the stream
            # restarts at its head, and everything held goes.
            for k in self.state.restart_at(self.root_seq):
                del self.store[k]
            self.next_rec = len(self.records)

    @rule()
    def node_restart(self) -> None:
        # What the node's store persists: entries, applied seq, horizon.
        old = self.state
        self.state = CacheState(BUDGET, old.applied, old.rules.horizon, recent_keys=3)
        for key, (value, version) in self.store.items():
            h = old.held[key]
            size = len(key) + (len(value) if value is not None else 0) + ENTRY_OVERHEAD
            for k in self.state.load(key, Held(h.read_seq, version, value is None), size, False):
                del self.store[k]
        self.pending.clear()

    @invariant()
    def agree(self) -> None:
        assert set(self.store) == set(self.state.held)
        assert self.state.held_bytes <= BUDGET
        assert self.state.applied <= self.root_seq


TestCacheVsModel = CacheVsModel.TestCase
TestCacheVsModel.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
