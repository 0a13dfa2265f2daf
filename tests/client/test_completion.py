"""`mercury completion`: the scripts are generated from the parser, and bash's offers the
next words of the command line typed so far."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from mercury.cli import build_parser
from mercury.cmd_completion import bash_script, fish_script, zsh_script


def complete(words: list[str]) -> list[str]:
    """What bash offers after `words` (the last one being completed)."""
    line = " ".join(f"'{w}'" for w in words)
    script = bash_script(build_parser()) + (
        f"COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _mercury; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_offers_commands_subcommands_and_flags() -> None:
    assert sorted(complete(["mercury", "k"])) == ["kt-bridge", "kv"]
    assert "import" in complete(["mercury", "kv", ""])
    assert sorted(complete(["mercury", "kv", "put", "--if"])) == ["--if-absent", "--if-seq"]
    # a flag typed before does not lose the command path
    assert complete(["mercury", "acl", "--log-level", "token", "re"]) == ["revoke"]
    assert "--consumer" in complete(["mercury", "acl", "token", "list", "--"])


def test_zsh_and_fish_scripts_name_every_command() -> None:
    parser = build_parser()
    assert "bashcompinit" in zsh_script(parser)
    fish = fish_script(parser)
    for cmd in ("kv", "acl", "usage", "completion"):
        assert f"-a {cmd}" in fish
    assert "-l if-absent" in fish
