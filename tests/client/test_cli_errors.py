"""No traceback reaches a CLI user: every `mercury` command, run against a stopped server and
with a missing file, ends with one line naming what failed (the URL or the file) and a
documented exit status. The commands are read from the parser, so a new one is covered."""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import pytest

from mercury.cli import build_parser, describe, main
from testkit.procs import free_port
from tests.test_api_doc import leaf_commands

#: Commands that wait for a source by design (a replica bootstraps from its source, a cache
#: node serves what it holds while it retries its sources, the bridge reconnects to its KT
#: server for ever): not one-shot, so not run here.
DAEMONS = {("replica",), ("cache",), ("kt-bridge",)}
#: What each exit status may be (docs/api.md: 0 done, 2 usage or refusal, 5 unavailable).
DOCUMENTED = {0, 2, 5}


def commands() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    return [(path, p) for path, p in leaf_commands(build_parser()) if path not in DAEMONS]


def argv_for(
    path: tuple[str, ...], p: argparse.ArgumentParser, files: Path, url: str, token: Path
) -> list[str]:
    """`path` with every positional filled (paths under `files`, which do not exist) and
    the connection flags it takes pointed at `url` with the token file `token`."""
    argv = list(path)
    for a in p._actions:
        if a.option_strings or (a.nargs == "?" and a.dest != "value"):
            continue
        if a.choices:
            argv.append(sorted(a.choices)[0])
        elif a.dest in ("data_dir", "out", "file", "snapshot"):
            argv.append(str(files / f"{a.dest}-{'-'.join(path)}"))
        elif a.dest == "value":
            argv.append("v")
        else:
            argv.append("p/x")
    opts = {o for a in p._actions for o in a.option_strings}
    for flag, value in (
        ("--url", url),
        ("--admin-token-file", str(token)),
        ("--token-file", str(token)),
        ("--retries", "1"),
        ("--listen", f"127.0.0.1:{free_port()}"),
        ("--repl-listen", f"127.0.0.1:{free_port()}"),
    ):
        if flag in opts:
            argv += [flag, value]
    return argv


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        status = int(e.code or 0)
    return status, capsys.readouterr().err


def check(argv: list[str], status: int, err: str, names: tuple[str, ...]) -> None:
    assert "Traceback" not in err, (argv, err)
    assert status in DOCUMENTED, (argv, status, err)
    if status != 0:
        lines = [ln for ln in err.splitlines() if "error" in ln or ln.startswith("mercury kv:")]
        assert len(lines) == 1, (argv, err)
        assert any(n in lines[0] for n in names), (argv, err)


@pytest.mark.parametrize(
    ("path", "p"), commands(), ids=lambda x: " ".join(x) if isinstance(x, tuple) else ""
)
def test_a_stopped_server_and_missing_files_end_in_one_line(
    path: tuple[str, ...],
    p: argparse.ArgumentParser,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    files = tmp_path / "missing"
    opts = {o for a in p._actions for o in a.option_strings}
    # 1. the server is down (every file the command reads exists)
    if "--url" in opts:
        argv = argv_for(path, p, files, url, token)
        if path == ("acl", "apply"):
            argv[2] = str(tmp_path / "acl.yaml")
            (tmp_path / "acl.yaml").write_text("producers: {}\n")
        if path == ("kv", "import"):
            argv[2] = str(tmp_path / "in.jsonl")
            (tmp_path / "in.jsonl").write_text('{"key": "p/x", "value": "v"}\n')
        status, err = run(argv, capsys)
        check(argv, status, err, (url,))
        assert status == 5, (argv, err)
    # 2. a missing file: the positional paths, and the token file
    missing_token = tmp_path / "no-token"
    argv = argv_for(path, p, files, url, missing_token)
    status, err = run(argv, capsys)
    check(argv, status, err, (str(files), str(missing_token)))


def test_a_command_reports_its_own_usage_and_urls_need_a_scheme(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, err = run(["kv", "put", "k", "v", "--nosuch"], capsys)
    assert status == 2 and "usage: mercury kv put" in err and "--nosuch" in err
    status, err = run(["acl", "log", "--admin-token-file", "t", "--bogus"], capsys)
    assert status == 2 and "usage: mercury acl log" in err
    status, err = run(["kv", "get", "k", "--url", "127.0.0.1:8080"], capsys)
    assert status == 2 and "http://127.0.0.1:8080" in err
    status, err = run(["kv", "get", "k", "--timeout", "0"], capsys)
    assert status == 2 and "--timeout" in err and "above 0" in err  # not 14 s of retries
    status, err = run(["usage", "--admin-token-file", "t", "--since", "yesterday"], capsys)
    assert status == 2 and "'yesterday'" in err and "-yesterday" not in err


def test_connection_failures_name_the_url_and_a_tls_failure_suggests_ca() -> None:
    request = httpx.Request("GET", "https://root.example:8443/v1/admin/audit")
    tls = httpx.ConnectError("[SSL: CERTIFICATE_VERIFY_FAILED] self-signed", request=request)
    message, status = describe(tls)
    assert status == 5 and "https://root.example:8443/v1/admin/audit" in message
    assert "--ca" in message
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=request)
    message, status = describe(refused)
    assert status == 5 and "--ca" not in message and "--url" in message
    message, status = describe(RuntimeError("a bug"))
    assert status == 1 and "--log-level debug" in message


def test_a_malformed_acl_file_is_one_line_naming_the_file_and_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "acl.yaml"
    bad.write_text('producers:\n  x: {keyspaces: ["x/"]\n')  # the flow mapping never closes
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    url = f"http://127.0.0.1:{free_port()}"
    status, err = run(
        ["acl", "apply", str(bad), "--url", url, "--admin-token-file", str(token)], capsys
    )
    assert status == 2 and err.count("\n") == 1, err  # pyyaml's message is five lines
    assert f"{bad} is not valid YAML at line 3" in err, err


def test_a_taken_port_is_named(tmp_path: Path) -> None:
    """`mercury root --listen` on a port another process holds: one line naming it."""
    import socket

    from testkit.procs import run_mercury

    data = tmp_path / "root"
    assert run_mercury("init", str(data)).returncode == 0
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = run_mercury(
            "root", str(data), "--listen", f"127.0.0.1:{port}", "--log-level", "error"
        )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"mercury: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ), done.stderr
