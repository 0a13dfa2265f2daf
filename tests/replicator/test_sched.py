"""`replicator.sched`: the read server asks for short slices, its children inherit them,
and the applier gives them up for SCHED_BATCH at its nice level; on a kernel without
custom slices (before Linux 6.12) or without sched_setattr every call answers False and
changes nothing. Run in child processes: the test runner's own scheduling is left alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from replicator import sched
from testkit.procs import REPO

PROBE = """
import json, os, subprocess, sys
from replicator import sched
out = {"favoured": sched.favour_reads(), "reader": sched.get_attr(0)}
child = subprocess.run(
    [sys.executable, "-c",
     "import json, os; from replicator import sched; os.nice(5); "
     "ok = sched.background_applier(); print(json.dumps([ok, sched.get_attr(0)]))"],
    capture_output=True, text=True, check=True,
)
out["applier"] = json.loads(child.stdout)
print(json.dumps(out))
"""


def _custom_slices() -> bool:
    """Whether this kernel takes a slice request (Linux >= 6.12 with sched_setattr)."""
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from replicator import sched; print(sched.request_slice(0, 200_000))",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return r.stdout.strip() == "True"


def test_reads_get_short_slices_and_the_applier_gives_them_up() -> None:
    if not _custom_slices():
        pytest.skip("this kernel has no per-task slices (Linux < 6.12)")
    r = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, check=True
    )
    out = json.loads(r.stdout)
    assert out["favoured"] is True
    assert out["reader"][2] == sched.READ_SLICE_NS
    ok, (policy, nice, slice_ns) = out["applier"]
    assert ok is True
    assert policy == sched.SCHED_BATCH
    assert nice == 5  # kept
    assert slice_ns > sched.READ_SLICE_NS  # the kernel's default again, not the inherited one


def test_unknown_threads_are_refused_without_raising() -> None:
    assert sched.get_attr(2**22 + 12345) is None
    assert sched.request_slice(2**22 + 12345, 200_000) is False
    assert sched.set_batch(2**22 + 12345) is False


def test_cpu_lists_parse_as_taskset_writes_them() -> None:
    assert sched.parse_cpus("3") == {3}
    assert sched.parse_cpus("0,2-4, 7") == {0, 2, 3, 4, 7}
    for bad in ("", "a", "1-", "-1", "3-1", "1,,2", "1.5", "\u00b3", "0-99999999999", "8192"):
        with pytest.raises(ValueError, match="CPU list"):
            sched.parse_cpus(bad)


def test_the_applier_leaves_the_read_server_cpus_of_its_own() -> None:
    allowed = frozenset({0, 1, 2, 3})
    assert sched.split_cpus(allowed, frozenset({3})) == {0, 1, 2}
    with pytest.raises(ValueError, match="not among"):
        sched.split_cpus(allowed, frozenset({4}))
    with pytest.raises(ValueError, match="leaving the read server none"):
        sched.split_cpus(allowed, allowed)


@given(st.text(max_size=40))
def test_any_cpu_list_parses_or_is_refused_cleanly(text: str) -> None:
    try:
        cpus = sched.parse_cpus(text)
    except ValueError as err:
        assert "CPU list" in str(err)
    else:
        assert cpus and all(0 <= c < sched.MAX_CPUS for c in cpus)


@given(st.frozensets(st.integers(0, sched.MAX_CPUS - 1), min_size=1, max_size=20))
def test_a_cpu_list_written_out_parses_back(cpus: frozenset[int]) -> None:
    assert sched.parse_cpus(",".join(map(str, sorted(cpus)))) == cpus
