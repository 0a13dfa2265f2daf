"""`mercury kv` as a user runs it, against a real root and replica: every command, the exit
statuses, and an import that resumes after a SIGKILL without writing anything twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from testkit.procs import REPO, free_port, mercury_cmd
from testkit.wait import wait_until
from tests.client.conftest import Cluster


def kv(
    c: Cluster, token_file: Path | None, *args: str, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    argv = ["kv", *args, "--url", c.root.url, "--read-url", c.read_url]
    if token_file is not None:
        argv += ["--token-file", str(token_file)]
    return subprocess.run(
        mercury_cmd(*argv), input=stdin, capture_output=True, timeout=120, cwd=REPO
    )


def _token_file(tmp_path: Path, token: str) -> Path:
    f = tmp_path / "token"
    f.write_text(token + "\n")
    return f


def _usage(c: Cluster, producer: str) -> dict[str, int]:
    doc: dict[str, int] = c.root.admin().get(f"/v1/usage/{producer}").json()
    return doc


def test_commands_and_exit_statuses(cluster: Cluster, tmp_path: Path) -> None:
    name, token = cluster.root.producer()
    tf = _token_file(tmp_path, token)
    r = kv(cluster, tf, "put", f"{name}/a", "hello")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] == "written"
    r = kv(cluster, tf, "put", f"{name}/bin", "-", stdin=b"\x00\xff\n")
    assert r.returncode == 0, r.stderr
    cluster.caught_up()
    r = kv(cluster, tf, "get", f"{name}/bin")
    assert (r.returncode, r.stdout) == (0, b"\x00\xff\n")
    r = kv(cluster, tf, "ls", f"{name}/")
    assert (r.returncode, r.stdout) == (0, f"{name}/a\n{name}/bin\n".encode())
    r = kv(cluster, tf, "ls", f"{name}/", "--values")
    assert [json.loads(x) for x in r.stdout.splitlines()] == [
        {"key": f"{name}/a", "value": "hello"},
        {"key": f"{name}/bin", "value_b64": "AP8K"},
    ]
    # conditions: a stale seq is refused (4), the current one applies
    seq = json.loads(kv(cluster, tf, "put", f"{name}/a", "v2").stdout)["seq"]
    r = kv(cluster, tf, "put", f"{name}/a", "x", "--if-absent")
    assert r.returncode == 4 and b"412" in r.stderr, r.stderr
    r = kv(cluster, tf, "del", f"{name}/a", "--if-seq", str(seq - 1))
    assert r.returncode == 4 and b"412" in r.stderr, r.stderr
    r = kv(cluster, tf, "del", f"{name}/a", "--if-seq", str(seq))
    assert (r.returncode, json.loads(r.stdout)["status"]) == (0, "deleted")
    cluster.caught_up()
    # 3: not found
    r = kv(cluster, tf, "get", f"{name}/a")
    assert r.returncode == 3, r.stderr
    # 4: refused (outside the keyspace; no token)
    r = kv(cluster, tf, "put", "elsewhere/a", "x")
    assert r.returncode == 4 and b"403" in r.stderr, r.stderr
    r = kv(cluster, None, "put", f"{name}/a", "x")
    assert r.returncode == 4 and b"401" in r.stderr, r.stderr
    # 5: unavailable (nothing listens there), after the retries
    down = f"http://127.0.0.1:{free_port()}"
    argv = ["kv", "put", f"{name}/a", "x", "--url", down, "--token-file", str(tf)]
    r = subprocess.run(
        mercury_cmd(*argv, "--retries", "2"), capture_output=True, timeout=60, cwd=REPO
    )
    assert r.returncode == 5, r.stderr
    # 2: usage
    r = kv(cluster, tf, "get")
    assert r.returncode == 2
    r = kv(cluster, tmp_path / "missing-token", "get", f"{name}/a")
    assert r.returncode == 2 and b"token-file" in r.stderr
    help_text = subprocess.run(
        mercury_cmd("kv", "--help"), capture_output=True, timeout=60, cwd=REPO
    ).stdout
    for line in (b"3  not found", b"4  refused", b"5  unavailable", b"2  usage"):
        assert line in help_text


def test_export_then_import_round_trips(cluster: Cluster, tmp_path: Path) -> None:
    name, token = cluster.root.producer()
    tf = _token_file(tmp_path, token)
    src = tmp_path / "src.jsonl"
    lines = [{"key": f"{name}/k{i:03d}", "value": f"v{i}"} for i in range(120)]
    lines.append({"key_b64": "", "value": ""})  # replaced below with a non-UTF-8 key
    lines[-1] = {"key": f"{name}/bin", "value_b64": "//4="}
    src.write_text("".join(json.dumps(x) + "\n" for x in lines) + "\n")
    r = kv(cluster, tf, "import", str(src), "--batch-size", "50")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert (summary["records"], summary["written"], summary["requests"]) == (121, 121, 3)
    assert not src.with_name("src.jsonl.mercury-import").exists()
    cluster.caught_up()
    r = kv(cluster, tf, "export", f"{name}/")
    assert r.returncode == 0, r.stderr
    exported = [json.loads(x) for x in r.stdout.splitlines()]
    assert sorted(exported, key=lambda d: d["key"]) == sorted(lines, key=lambda d: d["key"])
    # a malformed line is a usage error, named, before anything is sent
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"key": f"{name}/z", "value": "1"}) + "\n{oops\n")
    r = kv(cluster, tf, "import", str(bad))
    assert r.returncode == 2 and b"line 2" in r.stderr
    assert _usage(cluster, name)["writes"] == 121


def test_import_resumes_after_sigkill_without_writing_twice(
    cluster: Cluster, tmp_path: Path
) -> None:
    # 40 ops/s: 600 records in batches of 20 take ~15 s, time enough to kill it midway.
    name, token = cluster.root.producer(quota={"ops_per_s": 40, "burst": 40})
    tf = _token_file(tmp_path, token)
    src = tmp_path / "big.jsonl"
    src.write_text(
        "".join(json.dumps({"key": f"{name}/k{i}", "value": "v"}) + "\n" for i in range(600))
    )
    ckpt = tmp_path / "big.ckpt"
    argv = ["kv", "import", str(src), "--batch-size", "20", "--checkpoint", str(ckpt)]
    argv += ["--url", cluster.root.url, "--token-file", str(tf)]
    with (tmp_path / "import.log").open("wb") as log:
        p = subprocess.Popen(mercury_cmd(*argv), stdout=log, stderr=log, cwd=REPO)
        try:

            def midway() -> bool:
                if p.poll() is not None:
                    return True  # ended early: the assertions below say how
                done = json.loads(ckpt.read_text() or "{}") if ckpt.exists() else {}
                return bool(done.get("records_done", 0) >= 100)

            wait_until(midway, 60, "100 records imported")
        finally:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == -signal.SIGKILL, (tmp_path / "import.log").read_text()
    done = json.loads(ckpt.read_text())["records_done"]
    assert 100 <= done < 600
    r = subprocess.run(mercury_cmd(*argv), capture_output=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["resumed_at"] == done
    # The batch in flight at the kill (committed or not) is sent again under the same key:
    # the root replays its first answer instead of writing it twice.
    u = _usage(cluster, name)
    assert (u["writes"], u["duplicates"]) == (600, 0), (u, summary)
    # and without the checkpoint every batch is a replay: still nothing written twice
    r = subprocess.run(mercury_cmd(*argv), capture_output=True, timeout=120, cwd=REPO)
    summary = json.loads(r.stdout)
    assert (summary["replayed"], summary["written"]) == (30, 600), summary
    u = _usage(cluster, name)
    assert (u["writes"], u["duplicates"]) == (600, 0), u
