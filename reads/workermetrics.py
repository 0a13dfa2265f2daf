"""`/metrics` of a node whose read path runs as several processes (`reads/workers.py`).

Prometheus scrapes one address, and with `--read-workers N` any of the N readers may
accept the scrape. So every reader writes its own exposition (its registry: read
latencies, errors, connections, CRC failures, and the node-wide gauges it computes alike)
to `DIR/reader-<i>.prom` once a second, atomically, and whichever reader answers
`/metrics` merges all N: its own, fresh, and the others' last files (at most a second old),
each series labelled `worker="<i>"`. Series keep their identity whichever reader answers;
a restarted reader starts its counters from zero under its own label, which Prometheus
treats as a counter reset. Sum across readers with `sum without (worker) (...)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

#: Seconds between two writes of a reader's own exposition.
WRITE_EVERY_S = 1.0


def _path(metrics_dir: str, index: int) -> str:
    return os.path.join(metrics_dir, f"reader-{index}.prom")


def write_own(metrics_dir: str, index: int) -> None:
    """Write this process's exposition for the other readers (atomic: tmp + rename)."""
    path = _path(metrics_dir, index)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(generate_latest())
    os.replace(tmp, path)


def _labelled(text: str, index: int) -> Iterator[Metric]:
    for fam in text_string_to_metric_families(text):
        out = Metric(fam.name, fam.documentation, fam.type, fam.unit)
        out.samples = [
            Sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp, s.exemplar)
            for s in fam.samples
        ]
        yield out


class _Merged:
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def render(metrics_dir: str, index: int, n: int) -> bytes:
    """The exposition of all `n` readers, each series labelled with its reader's index."""
    merged: dict[str, Metric] = {}
    for i in range(n):
        if i == index:
            text = generate_latest().decode()
        else:
            try:
                with open(_path(metrics_dir, i), encoding="utf-8") as f:
                    text = f.read()
            except FileNotFoundError:
                continue  # not started yet (or restarting): no series this time
        for fam in _labelled(text, i):
            if fam.name in merged:
                merged[fam.name].samples += fam.samples
            else:
                merged[fam.name] = fam
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(merged.values())))
    return generate_latest(registry)


def clear(metrics_dir: str) -> None:
    """Remove every reader's file (reader 0, before its pool starts and after it stopped:
    a reader killed before it could remove its own must not be served as live)."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(metrics_dir):
            if name.startswith("reader-"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(metrics_dir, name))


async def keep_writing(metrics_dir: str, index: int, stop: asyncio.Event) -> None:
    """Write this reader's exposition every `WRITE_EVERY_S` until `stop` (then remove it)."""
    os.makedirs(metrics_dir, exist_ok=True)
    try:
        while not stop.is_set():
            write_own(metrics_dir, index)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), WRITE_EVERY_S)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(_path(metrics_dir, index))
