"""The expirer's pure parts and how an expiry shows in a watch stream (no processes)."""

from __future__ import annotations

import orjson

from gateway.expirer import expiry_ops, next_wait
from reads.watch import change_line
from store.format import OP_DELETE, OP_EXPIRE, OP_SET_EXPIRING, expiring_value
from store.ops import EXPIRE


def test_due_keys_become_expiries_conditional_on_their_seq() -> None:
    ops, nbytes = expiry_ops([(b"a/k", 10, 7, "team"), (b"a/j", 11, 9, "")])
    assert [(o.op, o.key, o.owner, o.expect_seq, o.value) for o in ops] == [
        (EXPIRE, b"a/k", "team", 7, b""),
        (EXPIRE, b"a/j", "", 9, b""),
    ]
    assert nbytes == len(b"a/k") + len("team") + len(b"a/j")


def test_the_next_pass_comes_at_the_earliest_deadline_or_every_second() -> None:
    now = 1_000_000_000
    assert next_wait(now, 0, 1.0) == 1.0  # nothing expires: the regular pass
    assert next_wait(now, now + 250_000, 1.0) == 0.25
    assert next_wait(now, now + 5_000_000, 1.0) == 1.0
    assert next_wait(now, now - 5, 1.0) == 0.001  # already due: at once


def test_a_watch_stream_tells_an_expiry_from_a_delete() -> None:
    line = orjson.loads(change_line(5, OP_EXPIRE, b"a/k", b""))
    assert line == {"seq": 5, "op": "expire", "key": "a/k"}
    assert orjson.loads(change_line(6, OP_DELETE, b"a/k", b""))["op"] == "delete"
    dl = 1_800_000_000_000_000
    line = orjson.loads(change_line(7, OP_SET_EXPIRING, b"a/k", expiring_value(dl, b"v")))
    assert line == {
        "seq": 7,
        "op": "set",
        "key": "a/k",
        "value": "v",
        "expires_at": "2027-01-15T08:00:00Z",
    }
