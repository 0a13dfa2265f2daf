"""The replica's applier runs at a lower CPU priority than its readers (`--applier-nice`),
and with `--applier-cpus` on CPUs of its own, the readers on the others."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from replicator.status import read_status
from testkit import procstat
from testkit.procs import Procs, run_mercury
from testkit.procstat import stat_fields
from testkit.replication import root_node, wait_for, wait_seq
from tests.replicator.nodes import start_replica


def _nice(pid: int) -> int:
    return int(stat_fields(pid)[16])  # field 19 of /proc/PID/stat


def test_applier_worker_is_reniced_below_the_read_server(tmp_path: Path, procs: Procs) -> None:
    with root_node(str(tmp_path / "root")) as root:
        root.write(100)
        r = start_replica(procs, tmp_path / "r", [root.port], name="r")
        wait_seq(r.http, 100)
        wait_for(lambda: read_status(str(r.data_dir)) is not None, what="worker status")
        st = read_status(str(r.data_dir))
        assert st is not None
        parent = r.proc.pid
        assert st.pid != parent and procstat.running(st.pid)
        assert _nice(st.pid) == _nice(parent) + 5


def _cpus(pid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(pid))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to split")
def test_applier_cpus_pin_the_worker_and_keep_the_readers_off_them(
    tmp_path: Path, procs: Procs
) -> None:
    allowed = _cpus(0)
    applier = frozenset({max(allowed)})
    with root_node(str(tmp_path / "root")) as root:
        root.write(100)
        r = start_replica(
            procs, tmp_path / "r", [root.port], "--applier-cpus", str(max(allowed)), name="r"
        )
        wait_seq(r.http, 100)
        wait_for(lambda: read_status(str(r.data_dir)) is not None, what="worker status")
        st = read_status(str(r.data_dir))
        assert st is not None
        # every thread of the worker on its CPU, every thread of the read server off it
        for tid in procstat.threads(st.pid):
            assert _cpus(tid) == applier
        for tid in procstat.threads(r.proc.pid):
            assert _cpus(tid) == allowed - applier
        root.write(100, start=100)  # and it still applies
        wait_seq(r.http, 200)


def test_applier_cpus_that_leave_no_reader_cpu_are_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    every = ",".join(str(c) for c in sorted(_cpus(0)))
    out = run_mercury(
        "replica", str(tmp_path / "r"), "--source", "127.0.0.1:1", "--applier-cpus", every
    )
    assert out.returncode != 0
    assert "--applier-cpus" in out.stderr and "leaving the read server none" in out.stderr
    assert not (tmp_path / "r").exists()
    bad = run_mercury(
        "replica", str(tmp_path / "r"), "--source", "127.0.0.1:1", "--applier-cpus", "x"
    )
    assert bad.returncode != 0 and "CPU list 'x'" in bad.stderr
