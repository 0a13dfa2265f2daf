"""The CPU's feature flags, as Linux lists them in /proc/cpuinfo."""

from __future__ import annotations


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """Feature flags of the first CPU listed (x86 ``flags``, ARM ``Features``); empty where
    the file is missing or names none."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()
