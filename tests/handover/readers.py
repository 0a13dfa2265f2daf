"""Steady readers for the hand-over tests: keep-alive clients and a new connection per
read, every failure counted (no retries anywhere)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import httpx

#: Each reader stops after this many reads even if never told to (bounded load loop).
MAX_READS = 50_000


@dataclass
class Tally:
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, ok: bool, why: str = "") -> None:
        with self.lock:
            if ok:
                self.ok += 1
            else:
                self.failed.append(why)


class Readers:
    """`keepalive` threads reading `path` over one kept-alive connection each, and
    `fresh` threads opening a new connection for every read."""

    def __init__(self, url: str, path: str, want: bytes, keepalive: int = 2, fresh: int = 1):
        self.url, self.path, self.want = url, path, want
        self.tally = Tally()
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(True,), daemon=True) for _ in range(keepalive)
        ] + [threading.Thread(target=self._run, args=(False,), daemon=True) for _ in range(fresh)]

    def __enter__(self) -> Readers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _run(self, keepalive: bool) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1 if keepalive else 0)
        # No retries: httpx's transport retries nothing unless asked.
        with httpx.Client(base_url=self.url, timeout=10.0, limits=limits) as c:
            for _ in range(MAX_READS):
                if self.stop.is_set():
                    return
                try:
                    r = c.get(self.path)
                    good = r.status_code == 200 and r.content == self.want
                    self.tally.count(good, f"{r.status_code} {r.content[:60]!r}")
                except httpx.HTTPError as e:
                    self.tally.count(False, repr(e))
