"""`mercury kv` beyond one key at a time, against a real root and replica: every key, several
keys or a prefix in one get, a key's seq, delete by prefix, the token from the environment,
--quiet, JSON-array imports, every bad record reported, messages that name the flag to fix,
and an import whose progress and checkpoint follow each acknowledged request."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest

from mercury.cli import main
from tests.client.conftest import Cluster
from tests.client.test_cli import _token_file


class Ran(NamedTuple):
    returncode: int
    stdout: bytes
    stderr: bytes


Run = Callable[..., Ran]


@pytest.fixture
def mercury(capsysbinary: pytest.CaptureFixture[bytes]) -> Run:
    """`mercury ARGS` in this process (the commands' own code, a real cluster behind it;
    test_cli.py runs them as processes): its status, stdout and stderr."""

    def run(*argv: str) -> Ran:
        capsysbinary.readouterr()
        try:
            status = main(list(argv))
        except SystemExit as e:
            status = int(e.code or 0)
        out, err = capsysbinary.readouterr()
        return Ran(status, out, err)

    return run


@pytest.fixture
def kv(mercury: Run) -> Callable[..., Ran]:
    def run(c: Cluster, token_file: Path | None, *args: str) -> Ran:
        argv = ["kv", *args, "--url", c.root.url, "--read-url", c.read_url]
        if token_file is not None:
            argv += ["--token-file", str(token_file)]
        return mercury(*argv)

    return run


def test_reads_deletes_and_output(cluster: Cluster, tmp_path: Path, kv: Run) -> None:
    name, token = cluster.root.producer()
    tf = _token_file(tmp_path, token)
    for k in ("a", "b", "c/1", "c/2"):
        assert kv(cluster, tf, "put", f"{name}/{k}", k, "--quiet").stdout == b""
    cluster.caught_up()
    # ls without a prefix (or with an empty one) lists every key of the node
    every = kv(cluster, tf, "ls").stdout.split()
    assert {f"{name}/{k}".encode() for k in ("a", "b", "c/1", "c/2")} <= set(every)
    assert kv(cluster, tf, "ls", "").stdout.split() == every
    r = kv(cluster, tf, "ls", f"{name}/c/", "-o", "json")
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"key": f"{name}/c/1"},
        {"key": f"{name}/c/2"},
    ]
    # a key's seq (what --if-seq takes), several keys, a prefix
    got = json.loads(kv(cluster, tf, "get", f"{name}/a", "-o", "json").stdout)
    assert got["key"] == f"{name}/a" and got["value"] == "a" and got["seq"] > 0
    r = kv(cluster, tf, "put", f"{name}/a", "a2", "--if-seq", str(got["seq"]))
    assert r.returncode == 0, r.stderr
    r = kv(cluster, tf, "get", f"{name}/b", f"{name}/nope")
    assert r.returncode == 3
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"key": f"{name}/b", "value": "b"},
        {"key": f"{name}/nope", "value": None},
    ]
    r = kv(cluster, tf, "get", "--prefix", f"{name}/c/")
    assert [json.loads(x)["value"] for x in r.stdout.splitlines()] == ["c/1", "c/2"]
    # delete by prefix, and the aliases of del
    r = kv(cluster, tf, "del", "--prefix", f"{name}/c/")
    assert (r.returncode, json.loads(r.stdout)["deleted"]) == (0, 2), r.stderr
    assert json.loads(kv(cluster, tf, "rm", f"{name}/b").stdout)["status"] == "deleted"
    assert json.loads(kv(cluster, tf, "delete", f"{name}/b").stdout)["status"] == "absent"
    cluster.caught_up()
    assert kv(cluster, tf, "ls", f"{name}/").stdout == f"{name}/a\n".encode()


def test_token_from_the_environment_and_messages(
    cluster: Cluster, tmp_path: Path, mercury: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, token = cluster.root.producer()
    for var in ("MERCURY_TOKEN_FILE", "MERCURY_READ_URL", "MERCURY_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MERCURY_TOKEN", token)
    argv = ["kv", "put", f"{name}/e", "1", "--url", cluster.root.url]
    r = mercury(*argv)
    assert r.returncode == 0, r.stderr
    monkeypatch.delenv("MERCURY_TOKEN")
    r = mercury(*argv)
    assert r.returncode == 4 and b"MERCURY_TOKEN" in r.stderr, r.stderr
    # a range read sent to the root names --read-url and MERCURY_READ_URL
    tf = _token_file(tmp_path, token)
    r = mercury("kv", "ls", f"{name}/", "--url", cluster.root.url, "--token-file", str(tf))
    assert r.returncode == 4 and b"--read-url" in r.stderr and b"MERCURY_READ_URL" in r.stderr
    # a base URL with a path no route serves is a usage error, never "no key" (exit 3)
    for url, read_url in (
        (cluster.root.url + "/api", None),
        (cluster.root.url, cluster.read_url + "/api"),
    ):
        argv = ["kv", "get", f"{name}/e", "--url", url, "--token-file", str(tf)]
        r = mercury(*argv, *(["--read-url", read_url] if read_url else []))
        assert r.returncode == 2 and b"/api/v1/kv/" in r.stderr, r.stderr


def test_import_arrays_and_every_bad_record(cluster: Cluster, tmp_path: Path, kv: Run) -> None:
    name, token = cluster.root.producer()
    tf = _token_file(tmp_path, token)
    arr = tmp_path / "bulk.json"  # wrangler's bulk format: "base64": true
    arr.write_text(
        json.dumps(
            [
                {"key": f"{name}/w1", "value": "plain"},
                {"key": f"{name}/w2", "value": "aGk=", "base64": True},
                {"op": "delete", "key": f"{name}/w0"},
            ]
        )
    )
    r = kv(cluster, tf, "import", str(arr))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["written"] == 2
    cluster.caught_up()
    assert kv(cluster, tf, "get", f"{name}/w2").stdout == b"hi"
    consul = tmp_path / "consul.json"  # consul kv export: every value base64
    consul.write_text(json.dumps([{"key": f"{name}/c1", "flags": 0, "value": "Y29uc3Vs"}]))
    r = kv(cluster, tf, "import", str(consul), "--base64-values")
    assert r.returncode == 0, r.stderr
    cluster.caught_up()
    assert kv(cluster, tf, "get", f"{name}/c1").stdout == b"consul"
    # every bad line is named with what is wrong with it, and nothing is written
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"key": f"{name}/ok", "value": "1"})
        + "\n[1, 2]\n"
        + json.dumps({"key": f"{name}/n", "value": 5})
        + "\n{oops\n"
        + json.dumps({"value": "x"})
        + "\n"
    )
    r = kv(cluster, tf, "import", str(bad))
    err = r.stderr.decode()
    assert r.returncode == 2 and "4 bad record(s)" in err, err
    assert "line 2: a record is a JSON object, not an array" in err
    assert "line 3: value must be a string, not a number" in err
    assert "line 4: not JSON" in err and "line 5: no key" in err
    cluster.caught_up()
    assert kv(cluster, tf, "get", f"{name}/ok").returncode == 3


def test_import_progress_follows_each_acknowledged_request(
    cluster: Cluster, tmp_path: Path, kv: Run
) -> None:
    # The quota admits at most burst + rate x max_delay = 30 + 3000 x 0 = 30 ops a request
    # (refilled in 10 ms):
    # the first 300-record request is refused (413, max_ops 30), then 30 at a time.
    name, token = cluster.root.producer(quota={"ops_per_s": 3000, "burst": 30, "max_delay_ms": 0})
    tf = _token_file(tmp_path, token)
    src = tmp_path / "throttled.jsonl"
    src.write_text(
        "".join(json.dumps({"key": f"{name}/k{i}", "value": "v"}) + "\n" for i in range(300))
    )
    r = kv(cluster, tf, "import", str(src), "--progress")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["requests"] == 10
    # the bar moved at each acknowledged request (tqdm redraws it on each update)
    shown = {int(m.split(b"/")[0]) for m in r.stderr.replace(b"\r", b"\n").split() if b"/300" in m}
    assert shown == set(range(0, 301, 30)), r.stderr


def test_admin_commands_print_json_and_take_the_environment(
    cluster: Cluster, tmp_path: Path, mercury: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = tmp_path / "admin.token"
    admin.write_text(cluster.root.admin_token + "\n")
    monkeypatch.setenv("MERCURY_URL", cluster.root.url)
    monkeypatch.setenv("MERCURY_ADMIN_TOKEN_FILE", str(admin))
    doc = tmp_path / "acl.yaml"
    doc.write_text('producers:\n  jsonout: {keyspaces: ["jsonout/"]}\n')
    r = mercury("acl", "apply", str(doc), "--dry-run", "-o", "json")
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["dry_run"] is True and "+ producer jsonout" in answer["changes"]
    r = mercury("acl", "log", "-o", "json")
    assert r.returncode == 0 and all(json.loads(x)["seq"] for x in r.stdout.splitlines())
    r = mercury("usage", "-o", "json")
    assert r.returncode == 0 and "producers" in json.loads(r.stdout), r.stderr


def test_tables_and_quiet_admin_commands(
    cluster: Cluster, tmp_path: Path, kv: Run, mercury: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`-o table` (etcdctl's -w table) on kv get/ls and the admin listings; `-q` on admin
    commands prints no confirmation."""
    name, token = cluster.root.producer()
    tf = _token_file(tmp_path, token)
    assert kv(cluster, tf, "put", f"{name}/t", "two\nlines").returncode == 0
    cluster.caught_up()
    r = kv(cluster, tf, "get", f"{name}/t", "-o", "table")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    assert lines[0].startswith("+-") and lines[1].split() == [
        "|",
        "KEY",
        "|",
        "VALUE",
        "|",
        "SEQ",
        "|",
    ]
    assert f"| {name}/t | two\\nlines |" in lines[3]  # one row stays one line
    r = kv(cluster, tf, "ls", f"{name}/", "--values", "-o", "table")
    assert (
        r.returncode == 0 and "| VALUE" in r.stdout.decode() and "two\\nlines" in r.stdout.decode()
    )
    r = kv(cluster, tf, "get", f"{name}/t", f"{name}/none", "-o", "table")
    assert r.returncode == 3 and f"| {name}/none |" in r.stdout.decode()

    admin = tmp_path / "admin.token"
    admin.write_text(cluster.root.admin_token + "\n")
    monkeypatch.setenv("MERCURY_URL", cluster.root.url)
    monkeypatch.setenv("MERCURY_ADMIN_TOKEN_FILE", str(admin))
    r = mercury("acl", "token", "list", name, "-o", "table")
    assert r.returncode == 0 and "| TOKEN_ID" in r.stdout.decode(), r.stderr
    r = mercury("acl", "log", "-o", "table")
    assert r.returncode == 0 and "| SEQ" in r.stdout.decode(), r.stderr
    r = mercury("acl", "token", "create", name, "-q")
    assert r.returncode == 0 and r.stderr == b"" and r.stdout.count(b"\n") == 1
    doc = tmp_path / "acl.yaml"
    doc.write_text('producers:\n  quiet: {keyspaces: ["quiet/"]}\n')
    r = mercury("acl", "apply", str(doc), "-q")
    assert (r.returncode, r.stdout, r.stderr) == (0, b"", b"")
    assert "+ producer quiet" in mercury("acl", "log").stdout.decode()  # it was applied


def test_import_from_stdin_writes_every_record(
    cluster: Cluster, tmp_path: Path, kv: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kv import -` (a pipe is read twice otherwise: checked, then sent, and the second
    read found it empty: 0 records, exit 0)."""
    import io

    name, token = cluster.root.producer()
    tf = _token_file(tmp_path, token)
    lines = f'{{"key": "{name}/s1", "value": "1"}}\n{{"key": "{name}/s2", "value": "2"}}\n'
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(lines.encode())))
    r = kv(cluster, tf, "import", "-")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["written"] == 2, r.stdout
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"{bad\n")))
    r = kv(cluster, tf, "import", "-")
    assert r.returncode == 2 and b"stdin: 1 bad record(s)" in r.stderr, r.stderr
