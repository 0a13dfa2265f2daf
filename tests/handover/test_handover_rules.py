"""The hand-over's pure rules: the socket tables of MERCURY_HANDOVER_FDS and systemd's
LISTEN_FDS/LISTEN_FDNAMES, the progress lines, unix listen addresses and modes."""

from __future__ import annotations

import pytest

from core.addr import UnixAddr, parse_listen, parse_mode
from core.errors import ConfigError
from net.handover import (
    format_handover_fds,
    parse_handover_fds,
    parse_listen_fds,
    parse_stage,
    stage_line,
)


def test_the_handover_table_round_trips_and_refuses_garbage() -> None:
    table = {"http": 5, "repl": 6, "memcached": 9}
    assert parse_handover_fds(format_handover_fds(table)) == table
    assert parse_handover_fds("") == {}
    for bad in ("http", "http=x", "=3", "http=3,kt"):
        with pytest.raises(ValueError):
            parse_handover_fds(bad)
    with pytest.raises(ValueError):
        format_handover_fds({"a,b": 3})


def test_systemd_sockets_are_named_from_fd_3_and_only_for_this_pid() -> None:
    env = {"LISTEN_PID": "42", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "http:repl"}
    assert parse_listen_fds(env, 42) == {"http": 3, "repl": 4}
    assert parse_listen_fds(env, 43) == {}  # meant for another process (our parent)
    # one unnamed socket is the HTTP one; several must be named
    assert parse_listen_fds({"LISTEN_PID": "7", "LISTEN_FDS": "1"}, 7) == {"http": 3}
    with pytest.raises(ValueError, match="FileDescriptorName"):
        parse_listen_fds({"LISTEN_PID": "7", "LISTEN_FDS": "2"}, 7)
    with pytest.raises(ValueError, match="names 1"):
        parse_listen_fds({"LISTEN_PID": "7", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "http"}, 7)
    with pytest.raises(ValueError, match="two sockets"):
        parse_listen_fds({"LISTEN_PID": "7", "LISTEN_FDS": "2", "LISTEN_FDNAMES": "a:a"}, 7)


def test_progress_lines() -> None:
    assert parse_stage(stage_line("READY")) == ("READY", "")
    assert parse_stage(stage_line("FAILED", "no\nstore")) == ("FAILED", "no store")


def test_unix_listen_addresses_and_modes() -> None:
    assert parse_listen("unix:/run/m/r.sock", "--listen", 0o600) == UnixAddr("/run/m/r.sock", 0o600)
    assert parse_listen("127.0.0.1:8081") == ("127.0.0.1", 8081)
    for bad in ("unix:rel.sock", "unix:/dir/", "unix:"):
        with pytest.raises(ConfigError, match="--listen"):
            parse_listen(bad, "--listen")
    assert parse_mode("660") == 0o660 and parse_mode("0600") == 0o600
    for bad in ("999", "rw", "-1", "1777"):
        with pytest.raises(ConfigError, match="--unix-mode"):
            parse_mode(bad)
