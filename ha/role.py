"""Which role a candidate plays, decided from what etcd shows (pure).

The election key ``/mercury/<group>/leader`` holds the leader's `LeaderInfo` and is bound
to the leader's lease: it exists exactly while that lease lives. Its create revision is the
leader's **term**: etcd revisions only grow, so every new leadership has a larger term than
any before it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass


class Role(enum.StrEnum):
    """A candidate's role."""

    LEADER = "leader"
    STANDBY = "standby"
    ELECTING = "electing"


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    """Who leads: its node name, client URL and replication address, and its term."""

    node: str
    url: str
    repl: str
    term: int

    def encode(self) -> bytes:
        """The election key's value (the term is the key's create revision, not stored)."""
        return json.dumps({"node": self.node, "url": self.url, "repl": self.repl}).encode()

    @classmethod
    def decode(cls, value: bytes, term: int) -> LeaderInfo:
        """Parse an election key's value; ValueError when it is not one of ours."""
        try:
            raw = json.loads(value)
            return cls(str(raw["node"]), str(raw["url"]), str(raw["repl"]), term)
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"election key holds no leader description: {err}") from err


def election_key(group: str) -> bytes:
    """The etcd key of `group`'s election."""
    return f"/mercury/{group}/leader".encode()


@dataclass(frozen=True, slots=True)
class View:
    """A candidate's role at one moment, and the leader it knows (None: none)."""

    role: Role
    leader: LeaderInfo | None

    @property
    def term(self) -> int | None:
        """The current term (None during an election)."""
        return self.leader.term if self.leader is not None else None


def decide(
    me: str, my_lease: int | None, leader: LeaderInfo | None, lease_of_key: int, lease_valid: bool
) -> View:
    """The role of candidate `me` holding lease `my_lease` when the election key names
    `leader` (bound to lease `lease_of_key`).

    A candidate leads only while the key is bound to its own live lease: the node name
    alone is not enough (a restarted process of the same node has a new lease, and the old
    key will expire with the old one).
    """
    if leader is None:
        return View(Role.ELECTING, None)
    if my_lease is not None and lease_of_key == my_lease and leader.node == me:
        return View(Role.LEADER, leader) if lease_valid else View(Role.ELECTING, None)
    return View(Role.STANDBY, leader)


def may_route(view: View, lease_renewing: bool, link_lost: bool) -> bool:
    """Whether a standby with `view` may send a client to its leader (307) or pass it a
    write (`--ha-forward`). Only to a leader whose lease this node saw `lease_renewing`
    (`ha.lease.renewing`) on its last look at etcd, and not when its replication link to
    that leader was up and broke (`link_lost`): a killed leader's key and lease outlive it
    by up to the TTL, and a client sent there meanwhile meets a refused connection instead
    of the honest "election running, retry" (503 + Retry-After). A link never yet up (a
    standby still bootstrapping) says nothing about the leader."""
    return (
        view.role is Role.STANDBY and view.leader is not None and lease_renewing and not link_lost
    )


def progress_prefix(group: str) -> bytes:
    """Prefix of the keys where candidates publish how far their store is (`Progress`)."""
    return f"/mercury/{group}/applied/".encode()


#: How far a store is: (term of the last leadership in its log, last seq). Compared as a
#: tuple, like Raft's (last log term, last index): a deposed leader's unacknowledged tail
#: makes its seq larger, never its term.
Progress = tuple[int, int]


def encode_progress(p: Progress) -> bytes:
    """The value a candidate publishes."""
    return f"{p[0]}:{p[1]}".encode()


def decode_progress(value: bytes) -> Progress:
    """A published value (ValueError when malformed)."""
    term, _, seq = value.decode().partition(":")
    return int(term), int(seq)


def may_campaign(
    has_store: bool, lease_valid: bool, mine: Progress, others: list[Progress]
) -> bool:
    """A candidate campaigns only with a store (an empty DATA_DIR first bootstraps from the
    leader: it holds nothing to lead with), a live lease to bind the key to, and a store at
    least as far along as every other live candidate's: with several standbys and
    `--sync-standbys 1`, the one that confirmed the last acknowledged batch may be any of
    them, and the most advanced one holds it. "Further" compares the term of the store's
    last leadership first: a deposed leader back with a tail nobody acknowledged has the
    higher seq but the older term, and must not win over a standby of the newer leader."""
    return has_store and lease_valid and all(mine >= o for o in others)
