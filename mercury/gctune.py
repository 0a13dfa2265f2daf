"""Cyclic garbage collector settings for the processes that move big batches.

CPython starts a young-generation collection every 700 container allocations. A 1,000-op
batch request allocates several thousand (an op tuple, its result, list slots), and tens of
thousands of ops are alive at once while a batch fills and commits, so with the default
the collector runs many times per request and its older-generation passes walk every live
op, plus every object of the imported libraries. Measured on the root under sixteen
concurrent 1,000-pair bulk loaders: 226k pairs/s with the defaults, 311k with a 100,000
young threshold (docs/notes/2026-gateway-measurements.md). Our objects are acyclic, so
collecting less often frees nothing later than it would have been. The price: a young
collection may now walk up to 100,000 live objects, about 4 ms on this machine (0.1 ms for
the default's 700), so the event loop pauses rarely but a little longer.
"""

from __future__ import annotations

import gc

#: Allocations between two young-generation collections (CPython's default: 700).
YOUNG_THRESHOLD = 100_000


def tune_for_batches() -> None:
    """Collect less often, and never re-walk what exists at start-up (imported modules,
    the app): call once, after imports and before serving."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
