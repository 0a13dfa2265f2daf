"""The applier keeps the memory it frees for the next records (`replicator/heap.py`,
`--applier-heap-keep-mb`): in a process of its own, an allocation pattern that faults its
memory in again every round stops faulting once the thresholds are set; the replica
tells its worker the amount; the flag's range is checked before anything starts. What it
saves a real replica is measured by `bench/read_under_write.py --systems
mercury,mercury-heap0` (docs/reads.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mercury.cli import build_parser
from mercury.settings import ReplicaConfig
from replicator.heap import HEAP_KEEP_MB
from replicator.worker import WorkerConfig
from testkit.procs import REPO
from tests.replicator.nodes import assert_refused_before_start


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # a C library that does not know the name
        return False


glibc = pytest.mark.skipif(not _glibc(), reason="mallopt thresholds are glibc's")

#: Rounds of a few blocks of a few hundred KB allocated and freed together, as a record's
#: working memory is. With glibc's adaptive thresholds (here set by the first block freed:
#: 256 KB, trimming above 512 KB) each round's freed 768 KB is trimmed and the next round
#: faults it in again; with the thresholds fixed it is reused.
_PATTERN = """
import json, resource, sys
sys.path.insert(0, {repo!r})
from replicator import heap
took = heap.keep_freed_memory() if sys.argv[1] == "keep" else None
warm = bytearray(256 << 10)  # glibc's thresholds follow the largest block freed so far
del warm
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for _ in range(50):
    blocks = [bytearray(256 << 10) for _ in range(3)]  # zero-filled: every page touched
    del blocks
print(json.dumps({{"took": took, "faults": faults() - before, "pages": 50 * 3 * 64}}))
"""


def _pattern(mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PATTERN.format(repo=str(REPO)), mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, int] = json.loads(out.stdout)
    return result


@glibc
def test_freed_blocks_are_reused_without_faulting_them_in_again() -> None:
    kept = _pattern("keep")
    assert kept["took"] is True
    # Each round touches 192 pages; kept, they are the same pages every round.
    assert kept["faults"] < kept["pages"] // 20, kept
    # The pattern is one that faults without the setting (else this test shows nothing).
    default = _pattern("default")
    assert default["faults"] > 4 * kept["faults"], (default, kept)


def _replica_config(tmp_path: Path, *flags: str) -> ReplicaConfig:
    args = build_parser().parse_args(
        ["replica", str(tmp_path / "r"), "--source", "127.0.0.1:1", *flags]
    )
    return ReplicaConfig.from_args(args)


def test_the_worker_is_told_how_much_freed_memory_to_keep(tmp_path: Path) -> None:
    assert _replica_config(tmp_path).worker.heap_keep_mb == HEAP_KEEP_MB
    cfg = _replica_config(tmp_path, "--applier-heap-keep-mb", "0").worker
    assert WorkerConfig.from_json(cfg.to_json()).heap_keep_mb == 0
    # a config written by an earlier release (no field) keeps the default
    raw = json.loads(cfg.to_json())
    del raw["heap_keep_mb"]
    assert WorkerConfig.from_json(json.dumps(raw)).heap_keep_mb == HEAP_KEEP_MB


def test_a_heap_keep_out_of_range_is_refused_before_anything_starts(tmp_path: Path) -> None:
    assert_refused_before_start(tmp_path / "r", "--applier-heap-keep-mb", ("-1", "1025", "x"))
