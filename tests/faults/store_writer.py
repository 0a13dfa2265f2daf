"""A writer process for the SIGKILL test: applies numbered batches until killed.

Batch i sets K fresh keys ``b%06d-%02d``, overwrites the S shared keys ``shared-%02d`` and
sets ``latest`` to i, so every batch logs K + S + 1 entries and every value says which batch
wrote it (`fresh_value`, `shared_value`). Before each apply it prints ``sending <i>`` and
after the commit ``committed <i> <seq>`` (both flushed), so the test knows what was sent and
what was acknowledged.
"""

from __future__ import annotations

import sys

from store.ops import SET, Op
from store.store import Store

K = 50
S = 5
PER_BATCH = K + S + 1


def fresh_value(i: int, j: int) -> bytes:
    """The value batch `i` writes to its own key `j`."""
    return b"value-%d-%d" % (i, j) * 4


def shared_value(i: int, j: int) -> bytes:
    """The value batch `i` writes to shared key `j` (every batch overwrites them)."""
    return b"shared-%d-%d" % (i, j)


def main() -> None:
    path = sys.argv[1]
    s = Store.open(path)  # fsync on commit: committed means durable
    i = s.last_seq() // PER_BATCH
    while True:
        ops = [Op(SET, b"b%06d-%02d" % (i, j), fresh_value(i, j), "w") for j in range(K)]
        ops += [Op(SET, b"shared-%02d" % j, shared_value(i, j), "w") for j in range(S)]
        ops.append(Op(SET, b"latest", b"%d" % i, "w"))
        print(f"sending {i}", flush=True)
        r = s.apply(ops)
        print(f"committed {i} {r.last_seq}", flush=True)
        i += 1


if __name__ == "__main__":
    main()
