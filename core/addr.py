"""`HOST:PORT` arguments (listeners and replication sources), parsed in one place."""

from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError

#: Default file mode of a unix listening socket: its owner and group may connect.
UNIX_MODE = 0o660


@dataclass(frozen=True, slots=True)
class UnixAddr:
    """A unix socket listener (`--listen unix:/path`): its path and file mode, which say
    who may connect (connecting takes write permission on the socket file)."""

    path: str
    mode: int = UNIX_MODE

    def __str__(self) -> str:
        return f"unix:{self.path}"


def parse_listen(
    value: str, what: str = "address", mode: int = UNIX_MODE
) -> tuple[str, int] | UnixAddr:
    """``"H:P"`` as `parse_hostport`, or ``"unix:/absolute/path"`` -> UnixAddr(path, mode)."""
    if value.startswith("unix:"):
        path = value[len("unix:") :]
        if not path.startswith("/") or path.endswith("/"):
            raise ConfigError(
                f"{what} must be unix:/absolute/path/of/the/socket, got {value!r}",
                hint="e.g. unix:/run/mercury/read.sock",
            )
        return UnixAddr(path, mode)
    return parse_hostport(value, what)


def parse_mode(value: str, what: str = "--unix-mode") -> int:
    """An octal file mode (``660``, ``0660``) -> int; ConfigError naming `what`."""
    try:
        mode = int(value, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"{what} must be an octal file mode, got {value!r}", hint="e.g. 660")
    return mode


def parse_hostport(value: str, what: str = "address") -> tuple[str, int]:
    """``"H:P"`` -> (H, P). An empty host (``":7070"``) or a bare port means 127.0.0.1;
    brackets around an IPv6 host are dropped. Raises ConfigError naming `what`."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "", value
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {value!r}", hint="e.g. 127.0.0.1:7070")
    return host.strip("[]") or "127.0.0.1", int(port)
