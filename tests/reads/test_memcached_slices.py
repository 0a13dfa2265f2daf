"""A huge pipelined memcached multi-get does not hold the listener's other clients: each
`get` line is read in slices of keys (`reads.replystream.BULK_SLICE`), the loop serving the
other connections between slices, as KT's get_bulk is. A real `python -m mercury.readserve`,
real sockets; the proof is by order (other clients answered while the multi-get is being
answered), not by a latency threshold."""

from __future__ import annotations

import socket
import threading
import time

from memcached import protocol as mc
from reads.replystream import BULK_SLICE
from store.store import Store
from tests.reads.conftest import StartReads, put

#: Keys in one `get` line: as many one-byte keys as a command line holds (`x x x ...`,
#: a key not in the store).
KEYS_PER_LINE = (mc.MAX_LINE - 8) // 2
#: Lines pipelined at once: several loop turns' worth of steps (net.tcp runs 16 a turn).
LINES = 48


def _recv_until(s: socket.socket, end: bytes) -> bytes:
    got = b""
    while not got.endswith(end):
        chunk = s.recv(65536)
        assert chunk, f"closed; got {got[-80:]!r}"
        got += chunk
    return got


def test_a_huge_pipelined_multi_get_does_not_hold_other_clients(
    store: Store, start_reads: StartReads
) -> None:
    put(store, {b"probe": b"v"})
    srv = start_reads(memcached=True)
    assert srv.memcached is not None
    line = b"get " + b" ".join([b"x"] * KEYS_PER_LINE) + b"\r\n"
    assert len(line) <= mc.MAX_LINE and KEYS_PER_LINE > 4 * BULK_SLICE
    one_reply = mc.END  # misses: the replies are small, so only the reads take time

    answers: list[float] = []
    stop = threading.Event()
    probe_errors: list[BaseException] = []

    def probe() -> None:
        try:
            with socket.create_connection(("127.0.0.1", srv.memcached), 10) as s:
                s.settimeout(60)
                while not stop.is_set():
                    s.sendall(b"get probe\r\n")
                    assert _recv_until(s, mc.END) == b"VALUE probe 0 1\r\nv\r\nEND\r\n"
                    answers.append(time.monotonic())
        except BaseException as err:  # reported by the main thread
            probe_errors.append(err)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.memcached), 10) as big:
            big.settimeout(120)
            sender = threading.Thread(target=big.sendall, args=(line * LINES,), daemon=True)
            sender.start()
            want = len(one_reply) * LINES
            got = bytearray()
            first_at = last_at = 0.0
            while len(got) < want:
                chunk = big.recv(1 << 20)
                assert chunk, f"closed after {len(got)} of {want} bytes"
                if not got:
                    first_at = time.monotonic()
                got += chunk
            last_at = time.monotonic()
            sender.join(10)
        assert bytes(got) == one_reply * LINES
    finally:
        stop.set()
        prober.join(30)
    assert not probe_errors, probe_errors
    during = [t for t in answers if first_at < t < last_at]
    # Unsliced, the other client is answered only between turns of 16 whole lines (about
    # LINES / 16 times); sliced, between every slice of BULK_SLICE keys.
    assert len(during) >= 4 * (LINES // 16), (
        f"{len(during)} answers to another client in the {last_at - first_at:.2f}s the "
        f"multi-get's {LINES} replies took"
    )
