"""Which hash a store's log chain uses: fixed when the store's lineage begins.

A store records its chain hash by name under ``meta`` key ``chain_hash`` (format >= 6). It
is chosen once, by `mercury init` (`Store.create`), and never changes: every node of a
lineage descends from that store through snapshots (a snapshot is a copy of ``meta`` too),
so the root and all its replicas hash alike, and equal seq and hash head still mean
identical logs. A store of format 5 or older has no key and chains with BLAKE2b-256; the
format-6 migration records that name, so every current store names its hash.

Every node hashes every byte written, so the hash is a per-byte cost of the whole tree.
OpenSSL computes SHA-256 with the CPU's SHA extensions where they exist (x86 ``sha_ni``,
ARMv8 ``sha2``), and there it costs 0.6 of BLAKE2b-256's time; without them 1.5-1.9 times
BLAKE2b's (`bench/chain_hash.py --without-sha-extensions`). `mercury init` therefore picks
SHA-256 when the CPU it runs on has the extensions and BLAKE2b-256 otherwise (`pick`), and
``--chain-hash`` overrides that for a fleet whose CPUs differ from the first node's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from core.errors import CorruptionError
from store import format as fmt
from store.layout import K_CHAIN_HASH

#: Name recorded in ``meta`` -> the code the codec takes.
BY_NAME: dict[str, int] = {"sha256": fmt.CHAIN_SHA256, "blake2b-256": fmt.CHAIN_BLAKE2B}
NAMES: dict[int, str] = {code: name for name, code in BY_NAME.items()}
#: The hash `Store.create` records when the caller names none.
DEFAULT = "sha256"
#: CPU flags (as Linux's ``/proc/cpuinfo`` names them) that mean SHA-256 in hardware.
SHA_FLAGS = frozenset({"sha_ni", "sha2"})
#: The hash of stores created before format 6 (which record none).
LEGACY = "blake2b-256"


def code(name: str) -> int:
    """The codec's code for chain hash `name` (ValueError names the known ones)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(
            f"unknown chain hash {name!r}: one of {', '.join(sorted(BY_NAME))}"
        ) from None


def pick(cpu_flags: Iterable[str]) -> str:
    """The faster chain hash on a CPU with `cpu_flags`: SHA-256 with SHA extensions,
    BLAKE2b-256 without."""
    return DEFAULT if SHA_FLAGS.intersection(cpu_flags) else LEGACY


def read(txn: Any, meta: Any) -> int:
    """The chain hash code the store of `txn` records (its ``meta`` sub-database: `meta`);
    BLAKE2b-256 when it records none (format 5 and older)."""
    raw = txn.get(K_CHAIN_HASH, db=meta)
    if raw is None:
        return fmt.CHAIN_BLAKE2B
    name = bytes(raw).decode("ascii", "replace")
    if name not in BY_NAME:
        raise CorruptionError(f"store records an unknown chain hash {name!r}")
    return BY_NAME[name]
