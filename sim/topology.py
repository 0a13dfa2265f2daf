"""The simulated tree's shape (pure): tiers, each node's ordered sources, link latencies.

Node 0 is the root (tier 0). The other nodes fill tiers 1..T-1 whose sizes grow by one
fan-out factor (the smallest that fits N nodes in T tiers, the last tier taking the rest):
1,000 nodes in 6 tiers are 1 -> 4 -> 14 -> 52 -> 196 -> 733. Each replica follows a node
of the tier above (its parent) and falls back to a second node of that tier, then to one of
the tier above it: sources are always in higher tiers, so the tree has no cycle by
construction (the simulator still checks that the sources in use never form one).
"""

from __future__ import annotations

from dataclasses import dataclass

#: One-way delay (seconds, uniform) of a link from tier t to the tier above, by t: tier 1
#: hangs off the root across continents, tier 2 within a region, deeper tiers within a
#: data centre.
LATENCY: dict[int, tuple[float, float]] = {
    1: (0.030, 0.080),
    2: (0.005, 0.020),
}
DC_LATENCY = (0.0002, 0.001)


def latency(tier: int) -> tuple[float, float]:
    """The delay range of the links from a node of `tier` up."""
    return LATENCY.get(tier, DC_LATENCY)


@dataclass(frozen=True)
class Topology:
    """Node names by tier, each replica's sources (in order) and each node's tier."""

    tiers: tuple[tuple[str, ...], ...]
    sources: dict[str, tuple[str, ...]]
    tier_of: dict[str, int]

    @property
    def root(self) -> str:
        return self.tiers[0][0]

    @property
    def replicas(self) -> list[str]:
        return [n for tier in self.tiers[1:] for n in tier]


def tier_sizes(nodes: int, tiers: int) -> list[int]:
    """How many nodes each tier holds (tier 0: the root alone)."""
    if tiers < 1 or nodes < tiers:
        raise ValueError(f"{nodes} nodes cannot fill {tiers} tiers (one node a tier at least)")
    if tiers == 1:
        return [1]
    rest = nodes - 1
    lo, hi = 1.0, float(rest)
    for _ in range(60):  # the smallest fan-out whose tiers hold `rest` nodes
        mid = (lo + hi) / 2
        if sum(max(1, round(mid**i)) for i in range(1, tiers)) >= rest:
            hi = mid
        else:
            lo = mid
    sizes = [1]
    left = rest
    for i in range(1, tiers):
        last = i == tiers - 1
        n = left if last else min(left - (tiers - 1 - i), max(1, round(hi**i)))
        sizes.append(n)
        left -= n
    return sizes


def build(nodes: int, tiers: int) -> Topology:
    """The tree of `nodes` nodes in `tiers` tiers."""
    names: list[tuple[str, ...]] = []
    k = 0
    for size in tier_sizes(nodes, tiers):
        names.append(tuple(f"n{k + j}" for j in range(size)))
        k += size
    sources: dict[str, tuple[str, ...]] = {}
    tier_of = {n: t for t, tier in enumerate(names) for n in tier}
    for t in range(1, len(names)):
        up = names[t - 1]
        for j, name in enumerate(names[t]):
            order = [up[j % len(up)]]
            if len(up) > 1:
                order.append(up[(j + 1) % len(up)])
            if t >= 2:
                upper = names[t - 2]
                order.append(upper[j % len(upper)])
            sources[name] = tuple(dict.fromkeys(order))
    return Topology(tuple(names), sources, tier_of)
