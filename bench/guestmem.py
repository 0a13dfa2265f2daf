"""What writing into fresh page-cache memory costs on this machine, and holding it steady.

A virtual machine whose balloon device reports free pages to its host (virtio-balloon free
page reporting, as Firecracker and other hypervisors use it) hands memory the guest frees
back to the host a few seconds later; the next time the guest uses that memory, each page
faults in the host first. A process appending to a file — an LMDB environment that grows, a
replica applying fresh values — gets its new page-cache pages from that memory and pays
for it in the kernel's copy of its writes, which the scheduler counts as its own CPU and a
kernel without full preemption does not interrupt. On bare metal that cost is absent, and
a node whose store has stopped growing rewrites pages already cached.

`python -m bench.guestmem [--mb N] [--wait S]` prints JSON: CPU ms per MB of 1 MB
`pwrite`s into a new file once the freed memory has had `--wait` seconds to be reported,
into the same file again (pages cached), into a new file right after freeing one, and —
where this process may write the kernel's reporting threshold (root) — into a new file
after the same wait with reporting held off. `--mb` should exceed what the guest keeps of
its freed memory unreported (the development machine's kernel keeps up to
`max_waiting_mib`, 1024: smaller probes land mostly in that), hence 4 GB.

The read and apply benches record `state()` in their output and take
`--hold-freed-memory` to run with reporting held off (restored when they end), so that
their phases measure the systems, not what the host did with the guest's free memory.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import mmap
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: bench/ is not an installed package
    sys.path.insert(0, str(REPO))

from testkit import procstat  # noqa: E402

PARAMS = Path("/sys/module/page_reporting/parameters")
ORDER = PARAMS / "page_reporting_order"
#: Free blocks of at least 2**order pages are reported; the buddy allocator's largest block
#: is order 10 on x86-64, so order 11 reports nothing.
HOLD_ORDER = 11
#: Memory `warm_free_memory` leaves untouched for everything else, and its step.
WARM_MARGIN = 2 << 30
WARM_STEP = 1 << 30
MADV_POPULATE_WRITE = 23  # Linux >= 5.14; not in Python 3.11's mmap module


def state() -> dict[str, Any] | None:
    """The guest's free page reporting as the kernel shows it: its order threshold and the
    KiB reported so far; None where the kernel has no page reporting."""
    try:
        out: dict[str, Any] = {"page_reporting_order": int(ORDER.read_text())}
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError, ValueError):
        out["reported_kib"] = int((PARAMS / "reported_kib").read_text())
    return out


def can_hold() -> bool:
    """True when this process may change the reporting threshold (it writes back the
    value it reads to find out)."""
    try:
        ORDER.write_text(ORDER.read_text().strip())
    except OSError:
        return False
    return True


@contextlib.contextmanager
def reporting_held() -> Iterator[None]:
    """Hold free page reporting off inside the block and restore the threshold after it,
    on SIGTERM too (the benches run until they are stopped or end)."""
    old = ORDER.read_text().strip()
    prev = signal.getsignal(signal.SIGTERM)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    ORDER.write_text(str(HOLD_ORDER))
    try:
        yield
    finally:
        ORDER.write_text(old)
        signal.signal(signal.SIGTERM, prev)


def warm_free_memory(margin: int = WARM_MARGIN) -> dict[str, float]:
    """Touch the guest's free memory (all but `margin`) once and free it again: with
    reporting held, the pages the host had taken back are the guest's again, so what the
    systems write next does not pay for their first touch. Returns the MB touched and the
    seconds it took (their ratio is this machine's cost of touching reported memory)."""
    t0 = time.monotonic()
    maps: list[mmap.mmap] = []
    try:
        while procstat.free_memory() > margin + WARM_STEP:
            m = mmap.mmap(-1, WARM_STEP)
            maps.append(m)
            try:
                m.madvise(MADV_POPULATE_WRITE)
            except OSError:  # an older kernel: one write per page
                for off in range(0, WARM_STEP, mmap.PAGESIZE):
                    m[off] = 1
    finally:
        for m in maps:
            m.close()
    return {"mb": len(maps) * WARM_STEP >> 20, "seconds": round(time.monotonic() - t0, 1)}


@contextlib.contextmanager
def held_and_warmed() -> Iterator[dict[str, float]]:
    """`reporting_held` with the free memory warmed first (`warm_free_memory`): the state a
    machine with memory of its own starts from. Yields what the warming took."""
    with reporting_held():
        yield warm_free_memory()


def hold_if_asked(
    asked: bool,
) -> tuple[contextlib.AbstractContextManager[dict[str, float] | None], str | None]:
    """The benches' `--hold-freed-memory`: `held_and_warmed()` when asked and possible,
    else a context that does nothing, with a note saying why when it was asked for."""
    if not asked:
        return contextlib.nullcontext(), None
    if state() is None or not can_hold():
        return contextlib.nullcontext(), "free page reporting absent or not writable: nothing held"
    return held_and_warmed(), None


def hold_for_run(asked: bool) -> dict[str, Any]:
    """`--hold-freed-memory` for a bench whose whole run is one phase: held (when asked and
    possible) until the process exits, restored then whatever happened. What to record in
    its output: whether it held, why not where asked, and the reporting's state."""
    hold, why_not = hold_if_asked(asked)
    stack = contextlib.ExitStack()
    stack.enter_context(hold)
    atexit.register(stack.close)
    return {
        "hold_freed_memory": asked and why_not is None,
        "hold_note": why_not,
        "free_page_reporting": state(),
    }


def write_cost(path: Path, mb: int) -> float:
    """CPU ms (this thread's, user + system) per MB of `mb` 1 MB `pwrite`s at the start of
    `path`: the page-cache copy, not the wait for the disk (the file is synced after the
    timed part, and dirty-page throttling sleeps without using CPU)."""
    block = os.urandom(1 << 20)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        t0 = time.thread_time()
        for i in range(mb):
            os.pwrite(fd, block, i << 20)
        spent = time.thread_time() - t0
        os.fsync(fd)
        return round(spent * 1000 / mb, 3)
    finally:
        os.close(fd)


def probe(where: Path, mb: int, wait: float) -> dict[str, Any]:
    """The four write costs of the module docstring (CPU ms per MB) and their ratios."""
    a, b = where / "probe-a", where / "probe-b"
    out: dict[str, Any] = {"mb": mb, "wait_s": wait, "state_at_start": state()}
    time.sleep(wait)
    out["new_file_after_wait"] = write_cost(a, mb)
    out["same_file_again"] = write_cost(a, mb)
    a.unlink()
    out["new_file_after_free"] = write_cost(b, mb)
    b.unlink()
    if state() is not None and can_hold():
        with reporting_held():
            write_cost(a, mb)  # memory the host holds now stays with the guest when freed
            a.unlink()
            time.sleep(wait)
            out["new_file_after_wait_held"] = write_cost(b, mb)
        b.unlink()
    cached = out["same_file_again"]
    out["ratios_to_cached"] = {
        k: round(out[k] / cached, 2)
        for k in ("new_file_after_wait", "new_file_after_free", "new_file_after_wait_held")
        if k in out
    }
    out["state_at_end"] = state()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--mb", type=int, default=4096, help="MB written per measurement")
    ap.add_argument("--wait", type=float, default=15.0, help="seconds between free and write")
    args = ap.parse_args()
    if not 1 <= args.mb <= 8192 or not 0 <= args.wait <= 600:
        ap.error("--mb 1-8192, --wait 0-600")
    with tempfile.TemporaryDirectory(prefix="guestmem-") as d:
        print(json.dumps(probe(Path(d), args.mb, args.wait), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
