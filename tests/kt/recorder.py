"""Record a real ktserver's replication stream, and replay it as a fake master (tests).

`python -m tests.kt.recorder --kt H:P --out FILE` runs `SCRIPT` (a fixed series of KT
writes over TSV-RPC) against a ktserver started with an update log and two databases
(see tests/data/kt/README.md), then connects as a replication slave and writes every byte
the master sent after its acceptance byte, up to the end of the last entry the script
caused, to FILE.

`ReplayMaster` serves a recorded stream to `mercury kt-bridge` on 127.0.0.1: it answers
the bridge's hello with the entries after the asked timestamp (optionally one every
`pace` seconds), then NOPs, as a ktserver does.
"""

from __future__ import annotations

import argparse
import socket
import struct
import threading
import time
from pathlib import Path

import httpx

from kt import ulog as kt_ulog

#: (procedure, parameters) sent in order; DB "1" is the second database.
SCRIPT: list[tuple[str, dict[str, str]]] = [
    ("set", {"key": "cfg/a", "value": "1"}),
    ("set", {"key": "cfg/b", "value": "two"}),
    ("set", {"key": "cfg/a", "value": "3"}),
    ("set", {"key": "cfg/long", "value": "v" * 300}),  # sizes as 2-byte varnums
    ("set", {"key": "cfg/xt", "value": "expiring", "xt": "3600"}),
    ("set", {"key": "other/x", "value": "db1", "DB": "1"}),
    ("remove", {"key": "cfg/b"}),
    ("set", {"key": "cfg/c", "value": "c"}),
    ("clear", {}),
    ("set", {"key": "cfg/d", "value": "after clear"}),
    ("set", {"key": "cfg/a", "value": "4"}),
    ("set", {"key": "cfg/e", "value": "tab\there"}),
    ("remove", {"key": "cfg/missing"}),  # KT logs nothing for a missing key
    ("set", {"key": "cfg/d", "value": "last"}),
]


def run_script(kt: str) -> None:
    """Send `SCRIPT` to the ktserver at `kt` (TSV-RPC, form-encoded)."""
    with httpx.Client(base_url=f"http://{kt}", timeout=10) as c:
        for proc, params in SCRIPT:
            r = c.post(f"/rpc/{proc}", data=params)
            if r.status_code not in (200, 450):
                raise RuntimeError(f"{proc} {params}: {r.status_code} {r.text}")


def record(kt: str, entries: int, timeout: float = 10.0, sid: int = 65535) -> bytes:
    """The stream bytes after the acceptance byte, up to the end of entry `entries`."""
    host, port = kt.rsplit(":", 1)
    out = bytearray()
    parser = kt_ulog.StreamParser()
    got = 0
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, int(port)), timeout=2) as s:
        s.sendall(kt_ulog.hello(0, sid))
        if s.recv(1) != bytes([kt_ulog.MAGIC_REPLICATION]):
            raise RuntimeError("the master refused replication (no -ulog?)")
        while got < entries:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {got} of {entries} entries in {timeout}s")
            data = s.recv(1 << 16)
            if not data:
                raise RuntimeError("the master closed the connection")
            for ev in parser.feed(data):
                if got >= entries:
                    break
                out += _encode(ev)
                if isinstance(ev, kt_ulog.Nop):
                    s.sendall(bytes([kt_ulog.MAGIC_REPLICATION]))
                else:
                    got += 1
    return bytes(out)


def _encode(ev: kt_ulog.Event) -> bytes:
    if isinstance(ev, kt_ulog.Nop):
        return bytes([kt_ulog.MAGIC_NOP]) + struct.pack(">Q", ev.ts)
    return kt_ulog.encode_entry(ev.ts, ev.message)


def load(path: Path) -> list[kt_ulog.Entry]:
    """The entries of a recorded stream (NOPs dropped)."""
    events = kt_ulog.StreamParser().feed(path.read_bytes())
    return [e for e in events if isinstance(e, kt_ulog.Entry)]


class ReplayMaster:
    """A fake KT master on 127.0.0.1 serving `entries` to replication slaves."""

    def __init__(self, entries: list[kt_ulog.Entry], pace: float = 0.0) -> None:
        self.entries = entries
        self.pace = pace
        self.hellos: list[tuple[int, int]] = []  # (ts, sid) of every slave that connected
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.port = int(self.sock.getsockname()[1])
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(5)
                hello = b""
                while len(hello) < 15:
                    chunk = conn.recv(15 - len(hello))
                    if not chunk:
                        return
                    hello += chunk
                _, _flags, ts, sid = struct.unpack(">BIQH", hello)
                self.hellos.append((ts, sid))
                conn.sendall(bytes([kt_ulog.MAGIC_REPLICATION]))
                last = ts
                for e in self.entries:
                    if e.ts <= ts:
                        continue
                    conn.sendall(kt_ulog.encode_entry(e.ts, e.message))
                    last = e.ts
                    if self.pace:
                        time.sleep(self.pace)  # deliberate: a master that trickles its log
                    if self.stopped.is_set():
                        return
                deadline = time.monotonic() + 120  # bounded: a test never waits longer
                while not self.stopped.is_set() and time.monotonic() < deadline:
                    conn.sendall(bytes([kt_ulog.MAGIC_NOP]) + struct.pack(">Q", last))
                    if conn.recv(1) != bytes([kt_ulog.MAGIC_REPLICATION]):
                        return
                    time.sleep(0.1)  # deliberate: a live master's NOP heartbeat interval
            except OSError:
                return

    def close(self) -> None:
        self.stopped.set()
        self.sock.close()
        self.thread.join(5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kt", required=True, help="ktserver H:P (started as in the README)")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument(
        "--entries", type=int, required=True, help="log entries the script makes (README)"
    )
    args = ap.parse_args()
    run_script(args.kt)
    data = record(args.kt, args.entries)
    args.out.write_bytes(data)
    print(f"{args.out}: {len(data)} bytes, {args.entries} entries")


if __name__ == "__main__":
    main()
