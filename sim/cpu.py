"""A CPU cost model for the simulator: each node is one core, and its work takes virtual time.

On a `VirtualClockLoop` the clock stands still while code runs, so a commit, a frame's
parse or a thread hand-off cost 0 s there; a real hop pays for each. With a model, every
unit a node sends or receives over `replicator.memnet` is work queued on that node's core
(first come, first served): a unit leaves only once its sender's core has encoded and
written it, and reaches the replication code only once its receiver's core has parsed it
and, for a RECORD frame, committed it. The costs are drawn from distributions measured
with the real code on the machine (`bench/sim_calibration.py --measure-cpu`), never
guessed; every draw comes from the run's seed, in the loop's (deterministic) order, so a
run stays a pure function of its parameters.

Pure: no I/O, no clock of its own (the caller passes the loop's instant).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

#: The least cost of any unit (s): a core's instants then strictly increase, so the timers
#: of one core never tie and units keep their order.
MIN_COST = 1e-9


@dataclass(frozen=True)
class CpuCosts:
    """Measured costs (seconds, each tuple a sample drawn from with equal likelihood)."""

    #: Parsing one received frame (header, bound, CRC of the body), any type.
    parse: tuple[float, ...]
    #: Committing one received log record of `commit_bytes` bytes (`Store.apply_log_records`).
    commit: tuple[float, ...]
    commit_bytes: int
    #: Extra seconds per record byte over (or under) `commit_bytes` (a fitted slope).
    commit_per_byte: float
    #: One hand-off between the event loop and the apply thread (a record takes two: to
    #: the thread and back).
    handoff: tuple[float, ...]
    #: Encoding and writing one frame to the socket (`frames.encode_record` + `send`).
    send: tuple[float, ...]


class Cores:
    """One core per node: when each is next free, and the draws of the costs."""

    def __init__(self, costs: CpuCosts, seed: int) -> None:
        self.costs = costs
        self.rng = random.Random(f"cpu/{seed}")
        self.free_at: dict[str, float] = {}
        #: Virtual seconds of work done per node (the report's CPU use).
        self.busy: dict[str, float] = {}

    def _take(self, node: str, now: float, cost: float) -> float:
        cost = max(MIN_COST, cost)
        done = max(now, self.free_at.get(node, 0.0)) + cost
        self.free_at[node] = done
        self.busy[node] = self.busy.get(node, 0.0) + cost
        return done

    def sent(self, node: str, size: int, now: float) -> float:
        """The instant a unit of `size` bytes written by `node` at `now` leaves it."""
        return self._take(node, now, self.rng.choice(self.costs.send) if size else 0.0)

    def received(self, node: str, size: int, record: bool, now: float) -> float:
        """The instant a unit of `size` bytes that reached `node` at `now` is parsed (and,
        a record, committed): when the replication code may see it."""
        c = self.costs
        cost = 0.0
        if size:
            cost = self.rng.choice(c.parse)
        if record:
            cost += self.rng.choice(c.commit) + c.commit_per_byte * (size - c.commit_bytes)
            cost += self.rng.choice(c.handoff) + self.rng.choice(c.handoff)
        return self._take(node, now, cost)
