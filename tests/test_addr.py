"""`HOST:PORT` arguments: one parser for listeners and sources."""

from __future__ import annotations

import pytest

from core.addr import parse_hostport
from core.errors import ConfigError


def test_forms_accepted() -> None:
    assert parse_hostport("127.0.0.1:7070") == ("127.0.0.1", 7070)
    assert parse_hostport("[::1]:7070") == ("::1", 7070)
    assert parse_hostport(":8081") == ("127.0.0.1", 8081)
    assert parse_hostport("7071") == ("127.0.0.1", 7071)
    assert parse_hostport("root:7070") == ("root", 7070)


@pytest.mark.parametrize("bad", ["", "host:", "host:port", "h:70000", "h:-1", "h"])
def test_malformed_is_a_config_error_naming_the_flag(bad: str) -> None:
    with pytest.raises(ConfigError, match="--source"):
        parse_hostport(bad, "--source")
