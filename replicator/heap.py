"""The applier's heap: memory it frees stays its own for the next record.

Why: a replica keeping up with a root that batches every 10 ms receives a record of a
few hundred KB at a time, with a pause after each. Applying one allocates the frame's
body, the decompressed payload and the buffers around them, and frees them before the
next record arrives. With glibc's adaptive thresholds the worker handed that memory back
and faulted it in again for each record: about 230 minor faults per MB applied at 16 MB/s,
most of them in zero-filling a frame's body and in copying into fresh buffers (a `perf`
sample of the faults), against 2-15 per MB at the root's full rate, where the memory
never goes idle. With the thresholds fixed as below, 5 per MB, and the worker's CPU per MB
at 16 MB/s fell by 4-11 % in three runs (`bench/read_under_write.py --systems
mercury,mercury-heap0`, `docs/reads.md`).

`keep_freed_memory` fixes both of glibc's thresholds for the process (which turns off
their adjustment): blocks up to `MMAP_BYTES` come from the heap, not from a mapping of
their own, and a heap is trimmed only when more than `TRIM_BYTES` is free at its top.
The worker's largest block is a frame of at most 16 MiB (`replicator/client.py`,
`READ_LIMIT`). The cost is resident memory: after a large record each thread's heap (the
event loop's, the apply thread's) may keep up to `TRIM_BYTES` it no longer uses, where
glibc would have handed most of it back. A record of a stream paced at 16 MB/s by a
root batching every 10 ms is about 160 KB.

Best effort, like `replicator/sched.py`: on a C library without `mallopt`, or whose
`mallopt` refuses these parameters, it returns False and the applier runs as before.
"""

from __future__ import annotations

import ctypes

#: glibc's `mallopt` parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's own ceiling for the mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX).
MMAP_BYTES = 32 << 20
#: Default of `--applier-heap-keep-mb`: free memory at the heap's top kept for the next
#: records.
HEAP_KEEP_MB = 32
TRIM_BYTES = HEAP_KEEP_MB << 20


def keep_freed_memory(trim_bytes: int = TRIM_BYTES, mmap_bytes: int = MMAP_BYTES) -> bool:
    """Set this process's malloc thresholds (module doc). True when the C library took
    both."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no such symbol in this process
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt answers 1 on success, 0 on a value it refuses.
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_bytes)) and bool(
        mallopt(M_TRIM_THRESHOLD, trim_bytes)
    )


def release_free_memory() -> bool:
    """Hand the memory every heap of this process holds free back to the system
    (`malloc_trim(0)`: the free pages inside each heap too, not only at its top). For
    after a burst that no longer runs (the catch-ups of many watchers, `reads/watch.py`):
    glibc keeps what it freed in each thread's heap, so without it the process would keep
    the burst's peak for ever. True when the C library did release some."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int
    return bool(trim(0))
