"""HA failover as clients see it (real etcd, three real candidates).

- While a killed leader's lease still lives, a standby never sends a client to it: its
  answer is 503 + Retry-After (`ha.role.may_route`), then the new leader's.
- With `--ha-forward` a write sent to a standby is applied by the leader and answered with
  the leader's own answer (Idempotency-Key included); a request already forwarded once is
  never forwarded again.
- An SDK `Client` given every candidate's URL, with its default settings, writes through a
  SIGKILL failover without one failed write.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from ha.front import FORWARDED_HEADER
from mercury_client import Client, MercuryClientError
from testkit.etcd import Etcd
from testkit.hacluster import Cluster, Node
from testkit.procs import Procs
from testkit.wait import wait_until


def _put(node: Node, token: str, key: str, value: bytes, **headers: str) -> httpx.Response:
    h = {"Authorization": f"Bearer {token}", **{k.replace("_", "-"): v for k, v in headers.items()}}
    return httpx.put(f"{node.url}/v1/kv/{key}", content=value, headers=h, timeout=30)


def _get(node: Node, token: str, key: str) -> httpx.Response:
    h = {"Authorization": f"Bearer {token}"}
    return httpx.get(f"{node.url}/v1/kv/{key}", headers=h, timeout=30)


def _answer(r: httpx.Response) -> tuple[int, str | None, str | None]:
    return r.status_code, r.headers.get("location"), r.headers.get("retry-after")


def test_standby_forwards_writes_and_never_sends_clients_to_a_dead_leader(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    # A 5 s lease (the default): the dead leader's key outlives it by seconds.
    cluster = Cluster(procs, tmp_path, etcd.url, n=3, ttl_s=5, extra=("--ha-forward",))
    cluster.start()
    token = cluster.token
    leader = cluster.wait_leader()
    standby, third = (n for n in cluster.nodes if n is not leader)
    wait_until(
        lambda: (standby.status() or {}).get("leader_url") == leader.url, 30, "a routing standby"
    )

    # Forwarded: the leader applies it and its answer comes back as it is.
    first = _put(standby, token, "k/fw", b"v1", Idempotency_Key="fw-1")
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "written"
    assert _get(leader, token, "k/fw").content == b"v1"
    again = _put(standby, token, "k/fw", b"v1", Idempotency_Key="fw-1")
    assert again.status_code == 200 and again.headers.get("idempotent-replayed") == "true"
    assert again.json()["seq"] == first.json()["seq"]
    # Reads are not forwarded (a watch never ends): the 307 to the confirmed leader.
    assert _answer(_get(standby, token, "k/fw"))[:2] == (307, f"{leader.url}/v1/kv/k/fw")
    # Forwarded once already: never again (a loop), and nothing applied.
    looped = _put(standby, token, "k/loop", b"x", **{"Mercury_Forwarded_By": "n9"})
    assert _answer(looped)[0::2] == (503, "1"), looped.text
    assert FORWARDED_HEADER == "Mercury-Forwarded-By"
    assert _get(leader, token, "k/loop").status_code == 404

    cluster.kill(leader)
    # Once the standby has seen its link to the dead leader break (its key and lease live
    # on for seconds), every answer until the next leader is the election's.
    wait_until(
        lambda: (standby.status() or {}).get("leader_link") in ("lost", None),
        30,
        "the standby sees its link to the dead leader lost (or an election began)",
    )
    answers: list[tuple[str, tuple[int, str | None, str | None]]] = []
    while True:
        answers.append(("GET", _answer(_get(standby, token, "k/fw"))))
        answers.append(("PUT", _answer(_put(standby, token, "k/during", b"d"))))
        new = cluster.leader()
        if new is not None:
            break
    dead = [a for a in answers if a[1][1] is not None and a[1][1].startswith(leader.url)]
    assert not dead, answers
    for _method, (status, location, retry_after) in answers:
        if status == 503:
            assert retry_after == "1"
        else:
            # Only once a new leader is known: its 307 or its answer.
            assert status in (200, 307), answers
            assert location is None or location.startswith(new.url), answers
    assert answers[0][1][0] == 503, answers
    assert new is not leader and new in (standby, third)
    # The survivor forwards to the new leader (the third candidate confirms its writes).
    other = third if new is standby else standby
    wait_until(
        lambda: _put(other, token, "k/after", b"a").status_code == 200, 60, "a forwarded write"
    )
    assert _get(new, token, "k/after").content == b"a"


WRITERS = 4
WRITES_EACH = 150


def test_sdk_with_every_candidate_writes_through_a_sigkill_failover(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    cluster = Cluster(procs, tmp_path, etcd.url, n=3)
    cluster.start()
    leader = cluster.wait_leader()
    # The leader first: a client that did not move on from a refused URL would stay on it.
    urls = [leader.url] + [n.url for n in cluster.nodes if n is not leader]
    killed = threading.Event()
    acked = [0] * WRITERS
    after_kill = [0] * WRITERS
    failures: list[BaseException] = []

    def write(w: int) -> None:
        # Default settings: the retry budget outlasts a failover.
        with Client(urls, cluster.token) as c:
            for i in range(WRITES_EACH):
                late = killed.is_set()
                try:
                    c.put(f"k/w{w}-{i}", f"v{i}")
                except MercuryClientError as err:
                    failures.append(err)
                    return  # one is a failed test: no need to wait out the others
                acked[w] += 1
                after_kill[w] += late

    threads = [threading.Thread(target=write, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    wait_until(lambda: sum(acked) >= 40, 60, "writes acknowledged before the kill")
    cluster.kill(leader)
    killed.set()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    assert failures == [], failures
    assert sum(acked) == WRITERS * WRITES_EACH
    assert sum(after_kill) > 0  # the failover happened under the writers
    new = cluster.wait_leader(not_=leader)
    with Client([new.url], cluster.token) as c:
        for w in range(WRITERS):
            for i in range(WRITES_EACH):
                assert c.get(f"k/w{w}-{i}") == f"v{i}".encode(), (w, i)


def test_a_standby_turning_leader_never_refuses_a_connection(
    etcd: Etcd, procs: Procs, tmp_path: Path
) -> None:
    """The candidate's front and its root serve one listening socket in turn: while the
    survivor of two turns leader, every connection to its address is answered (an
    election 503, then the new root's), none refused."""
    cluster = Cluster(procs, tmp_path, etcd.url, n=2, ttl_s=5)
    cluster.start()
    token = cluster.token
    leader = cluster.wait_leader()
    (standby,) = (n for n in cluster.nodes if n is not leader)
    assert _put(leader, token, "k/turn", b"t").status_code == 200
    cluster.kill(leader)
    statuses: list[int] = []
    refused: list[str] = []
    for _ in range(20_000):  # bounded: the election takes the lease time (5 s)
        try:
            # A new connection each time: the accept queue is what is under test.
            statuses.append(_get(standby, token, "k/turn").status_code)
        except httpx.ConnectError as err:
            refused.append(str(err))
        if statuses and statuses[-1] == 200 and cluster.leader() is standby:
            break
    assert not refused, refused[:3]
    assert statuses[-1] == 200 and cluster.leader() is standby, statuses[-5:]
