"""The fault schedule of a run (pure): what fails, when, for how long, from one seeded RNG.

Faults arrive as a Poisson process of `rate` per virtual second, each on a replica drawn
uniformly (the root is never failed: a root failover to a standby is not simulated), each
lasting a uniform 1..`max_duration` seconds and ending before `until` (after which the tree
must converge). Kinds:

- `kill`: the node's replication stops (its client, its source: links reset) and its
  store is closed; at the end it restarts on the same store.
- `partition`: the node and its first source are cut apart (nothing gets through, nobody
  closes: the stream goes stale and the node fails over), then healed.
- `delay`, `drop`, `reorder`, `corrupt`, `duplicate`: the link to its first source gets
  `DEGRADED` conditions of that kind (every unit delayed more; lost; held back so later
  ones overtake it; one byte flipped; delivered twice), then its own conditions again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

KINDS = ("kill", "partition", "delay", "drop", "reorder", "corrupt", "duplicate")

#: What a degraded link does, by fault kind (the `memnet.Conditions` fields changed).
DEGRADED: dict[str, dict[str, float]] = {
    "delay": {"extra_delay": 0.5},
    "drop": {"loss": 0.1},
    "reorder": {"reorder": 0.2, "reorder_delay": 0.05},
    "corrupt": {"corrupt": 0.1},
    "duplicate": {"duplicate": 0.1},
}


@dataclass(frozen=True)
class Fault:
    """One fault: `kind` on `node` from `at` for `duration` virtual seconds."""

    at: float
    kind: str
    node: str
    duration: float

    @property
    def end(self) -> float:
        return self.at + self.duration


def parse_kinds(text: str) -> tuple[str, ...]:
    """`kill,partition,...` (or `all`, or empty: none) as fault kinds; ValueError names an
    unknown one."""
    if not text:
        return ()
    if text == "all":
        return KINDS
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(KINDS)}")
    return kinds


def schedule(
    rng: random.Random,
    kinds: tuple[str, ...],
    replicas: list[str],
    *,
    rate: float,
    until: float,
    max_duration: float = 20.0,
) -> list[Fault]:
    """The faults of a run, in time order, each over by `until`."""
    out: list[Fault] = []
    if not kinds or not replicas or rate <= 0:
        return out
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= until - 1.0:
            return out
        kind = kinds[rng.randrange(len(kinds))]
        node = replicas[rng.randrange(len(replicas))]
        duration = min(rng.uniform(1.0, max_duration), until - t)
        out.append(Fault(round(t, 6), kind, node, round(duration, 6)))
