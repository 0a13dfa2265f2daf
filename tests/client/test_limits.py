"""The client's side of two answers the root is getting (413 naming the largest admissible
batch; 503 with Retry-After on a batch), over a real socket against a small ASGI server
that answers them, since the root does not name the limits yet. What is checked is what
the root sees: every op once, in order, and each Idempotency-Key with one body only."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from mercury_client import Client, TooLarge
from tests.client.watch_server import Pki, Served, make_pki


@dataclass
class LimitedRoot:
    """POST /v1/batch: 413 with `max_ops`/`max_bytes` beyond them; the first request of
    the second piece gets 503 Retry-After: 0; every other request is applied."""

    max_ops: int = 3
    max_bytes: int = 40
    applied: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str, bytes] = field(default_factory=dict)
    requests: int = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        self.requests += 1
        idem = dict(scope["headers"]).get(b"idempotency-key", b"").decode()
        assert self.seen.setdefault(idem, body) == body, f"key {idem} reused for another body"
        ops = json.loads(body)["ops"]
        cost = sum(len(o["key"]) + len(o.get("value", "")) for o in ops)
        if len(ops) > self.max_ops or (cost > self.max_bytes and len(ops) > 1):
            doc = {"title": "Content Too Large", "status": 413, "detail": "over the burst"}
            await _send(send, 413, {**doc, "max_ops": self.max_ops, "max_bytes": self.max_bytes})
        elif len(self.applied) == self.max_ops and not any(o.get("_503") for o in ops):
            ops[0]["_503"] = True  # only once
            self.applied.append({"_503": True})
            await _send(send, 503, {"title": "Service Unavailable", "status": 503}, retry=True)
        else:
            self.applied.extend(ops)
            await _send(send, 200, {"seq": len(self.applied), "written": len(ops)})


async def _send(send: Any, status: int, doc: dict[str, Any], retry: bool = False) -> None:
    headers = [(b"content-type", b"application/json")]
    if retry:
        headers.append((b"retry-after", b"0"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps(doc).encode()})


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def limited(pki: Pki) -> Iterator[tuple[LimitedRoot, Client]]:
    app = LimitedRoot()
    s = Served(app, pki)
    c = Client(s.url, "t", verify=str(pki.ca), cert=(str(pki.client_cert), str(pki.client_key)))
    try:
        yield app, c
    finally:
        c.close()
        s.stop()


def test_a_413_with_limits_recuts_the_batch_to_them(limited: tuple[LimitedRoot, Client]) -> None:
    app, c = limited
    ops = [("set", f"k{i}", "v" * (i % 5)) for i in range(10)]
    r = c.batch(ops, idempotency_key="job")
    got = [(o["key"], o["value"]) for o in app.applied if "_503" not in o]
    assert got == [(k, v) for _op, k, v in ops]  # every op once, in order
    assert r.written == 10
    # 1 refused whole batch + the pieces + the one 503 retried under the same key
    assert app.requests == 1 + r.requests + 1
    assert all(k.startswith("job:") for k in app.seen)


def test_without_split_the_413_surfaces_with_its_limits(
    limited: tuple[LimitedRoot, Client],
) -> None:
    app, c = limited
    app.max_bytes = 3
    with pytest.raises(TooLarge) as err:
        c.batch([("set", "a", "1"), ("set", "b", "2")], split=False)
    assert err.value.max_ops == 3 and err.value.max_bytes == 3
    assert app.applied == []
