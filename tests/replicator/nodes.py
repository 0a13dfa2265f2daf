"""Starting `mercury replica` processes for replication tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

from testkit.procs import Procs, free_port, run_mercury, wait_http


@dataclass
class Replica:
    """A running replica: its process, data dir and ports."""

    proc: Popen[bytes]
    data_dir: Path
    http: int
    repl: int
    args: tuple[str, ...]


def start_replica(
    procs: Procs,
    data_dir: Path,
    sources: list[int],
    *extra: str,
    name: str = "replica",
    repl: bool = True,
    http: int | None = None,
    repl_port: int | None = None,
    wait: bool = True,
) -> Replica:
    """Start `mercury replica` following 127.0.0.1:`sources` (in order)."""
    http = http or free_port()
    rport = (repl_port or free_port()) if repl else 0
    args: list[str] = ["replica", str(data_dir), "--listen", f"127.0.0.1:{http}"]
    for s in sources:
        args += ["--source", f"127.0.0.1:{s}"]
    if repl:
        args += ["--repl-listen", f"127.0.0.1:{rport}"]
    args += list(extra)
    p = procs.start_mercury(*args, name=name)
    if wait:
        wait_http(f"http://127.0.0.1:{http}/healthz", timeout=60, proc=p)
    return Replica(p, data_dir, http, rport, tuple(args))


def restart(procs: Procs, r: Replica, name: str = "replica", wait: bool = True) -> Replica:
    """Start the same replica again (same dir, ports and sources)."""
    p = procs.start_mercury(*r.args, name=name)
    if wait:
        wait_http(f"http://127.0.0.1:{r.http}/healthz", timeout=60, proc=p)
    return Replica(p, r.data_dir, r.http, r.repl, r.args)


def assert_refused_before_start(data_dir: Path, flag: str, values: tuple[str, ...]) -> None:
    """`mercury replica` with each of `values` for `flag` exits with an error naming the
    flag and leaves no data dir behind."""
    for value in values:
        out = run_mercury("replica", str(data_dir), "--source", "127.0.0.1:1", flag, value)
        assert out.returncode != 0, value
        assert flag in out.stderr, out.stderr
        assert not data_dir.exists()
