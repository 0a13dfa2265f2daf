"""A writer process for the SIGKILL test: applies numbered batches until killed.

Batch i sets K keys ``b%06d-%02d`` and the key ``latest`` to i, so every batch logs K + 1
entries and the store's state says exactly which batches committed. After each commit it
prints ``committed <i> <seq>`` (flushed), so the test knows what was acknowledged.
"""

from __future__ import annotations

import sys

from store.ops import SET, Op
from store.store import Store

K = 50


def main() -> None:
    path = sys.argv[1]
    s = Store.open(path)  # fsync on commit: committed means durable
    i = s.last_seq() // (K + 1)
    while True:
        ops = [Op(SET, b"b%06d-%02d" % (i, j), b"value-%d-%d" % (i, j) * 4, "w") for j in range(K)]
        ops.append(Op(SET, b"latest", b"%d" % i, "w"))
        r = s.apply(ops)
        print(f"committed {i} {r.last_seq}", flush=True)
        i += 1


if __name__ == "__main__":
    main()
