"""`HOST:PORT` arguments (listeners and replication sources), parsed in one place."""

from __future__ import annotations

from core.errors import ConfigError


def parse_hostport(value: str, what: str = "address") -> tuple[str, int]:
    """``"H:P"`` -> (H, P). An empty host (``":7070"``) or a bare port means 127.0.0.1;
    brackets around an IPv6 host are dropped. Raises ConfigError naming `what`."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "", value
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}", hint="e.g. 127.0.0.1:7070")
    return host.strip("[]") or "127.0.0.1", int(port)
