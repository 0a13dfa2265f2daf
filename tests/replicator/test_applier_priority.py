"""The replica's applier runs at a lower CPU priority than its readers (`--applier-nice`)."""

from __future__ import annotations

import os
from pathlib import Path

from replicator.status import read_status
from tests.replicator.harness import root_node, wait_for, wait_seq
from tests.replicator.nodes import start_replica
from tests.support.procs import Procs, stat_fields


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
        assert st.pid != parent and os.path.exists(f"/proc/{st.pid}")
        assert _nice(st.pid) == _nice(parent) + 5
