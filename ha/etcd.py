"""etcd v3 adapter over its JSON gateway (`/v3/...`, httpx): leases and the election key.

Why the JSON gateway and a transaction rather than etcd's election API: every call here is
one short unary POST (no gRPC stack, no long-lived campaign stream to babysit), and the
transaction "create the key if absent, bound to my lease" is exactly a campaign whose
result (won, or who holds the key) comes back at once; a standby then polls the key.

Several endpoints may be given: a call goes to the one that answered last and moves on to
the next when it fails to connect or answers 5xx, so one etcd member down costs one timeout.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import httpx

#: Seconds one etcd call may take (connect included).
CALL_TIMEOUT_S = 1.0


class EtcdError(Exception):
    """No endpoint answered the call, or it answered with an error."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd holds it."""

    value: bytes
    create_revision: int
    lease: int


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        base64.b64decode(raw.get("value", "")),
        int(raw.get("create_revision", 0)),
        int(raw.get("lease", 0)),
    )


class Etcd:
    """A client of one etcd cluster (`urls`: its members' client URLs)."""

    def __init__(self, urls: list[str], timeout_s: float = CALL_TIMEOUT_S) -> None:
        if not urls:
            raise ValueError("no etcd endpoint")
        self.urls = [u.rstrip("/") for u in urls]
        self._next = 0
        self._http = httpx.AsyncClient(timeout=timeout_s)

    async def close(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` on the first endpoint that answers."""
        errors = []
        for i in range(len(self.urls)):
            idx = (self._next + i) % len(self.urls)
            url = self.urls[idx]
            try:
                resp = await self._http.post(url + path, json=body)
            except httpx.HTTPError as err:
                errors.append(f"{url}: {type(err).__name__}: {err}")
                continue
            if resp.status_code >= 500:
                errors.append(f"{url}: {resp.status_code} {resp.text[:200]}")
                continue
            self._next = idx
            if resp.status_code != 200:
                raise EtcdError(f"{url}{path}: {resp.status_code} {resp.text[:200]}")
            out = resp.json()
            if "error" in out:
                raise EtcdError(f"{url}{path}: {out['error']}")
            return out  # type: ignore[no-any-return]
        raise EtcdError(f"{path}: no etcd endpoint answered ({'; '.join(errors)})")

    async def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (id, TTL granted in seconds)."""
        out = await self.call("/v3/lease/grant", {"TTL": ttl_s})
        return int(out["ID"]), int(out["TTL"])

    async def keepalive(self, lease: int) -> int:
        """Renew `lease`; the TTL it has again (0: it had expired or was revoked)."""
        out = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(out.get("result", {}).get("TTL", 0))

    async def time_to_live(self, lease: int) -> tuple[int, int]:
        """(seconds left, seconds granted) of `lease`; left is -1 once it expired."""
        out = await self.call("/v3/lease/timetolive", {"ID": str(lease)})
        return int(out.get("TTL", -1)), int(out.get("grantedTTL", 0))

    async def revoke(self, lease: int) -> None:
        """End `lease` now (its keys are deleted)."""
        await self.call("/v3/lease/revoke", {"ID": str(lease)})

    async def get(self, key: bytes) -> KeyValue | None:
        """The key, or None when absent."""
        out = await self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = out.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def create(self, key: bytes, value: bytes, lease: int) -> tuple[bool, KeyValue | None]:
        """Create `key` bound to `lease` unless it exists (one transaction): (True, the
        new key) when created, else (False, the key as it is; None if it vanished)."""
        k = _b64(key)
        out = await self.call(
            "/v3/kv/txn",
            {
                "compare": [{"key": k, "target": "CREATE", "create_revision": "0"}],
                "success": [{"request_put": {"key": k, "value": _b64(value), "lease": str(lease)}}],
                "failure": [{"request_range": {"key": k}}],
            },
        )
        if out.get("succeeded"):
            rev = int(out["header"]["revision"])
            return True, KeyValue(value, rev, lease)
        rng = out.get("responses", [{}])[0].get("response_range", {})
        kvs = rng.get("kvs") or []
        return False, (_kv(kvs[0]) if kvs else None)

    async def put(self, key: bytes, value: bytes, lease: int) -> None:
        """Set `key` bound to `lease` (it goes when the lease does)."""
        await self.call("/v3/kv/put", {"key": _b64(key), "value": _b64(value), "lease": str(lease)})

    async def prefix(self, prefix: bytes) -> dict[bytes, KeyValue]:
        """Every key starting with `prefix` (non-empty, not ending in 0xff)."""
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        out = await self.call("/v3/kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return {base64.b64decode(kv["key"]): _kv(kv) for kv in out.get("kvs") or []}

    async def delete_if(self, key: bytes, create_revision: int) -> bool:
        """Delete `key` if it is still the one created at `create_revision` (resign)."""
        k = _b64(key)
        out = await self.call(
            "/v3/kv/txn",
            {
                "compare": [
                    {"key": k, "target": "CREATE", "create_revision": str(create_revision)}
                ],
                "success": [{"request_delete_range": {"key": k}}],
            },
        )
        return bool(out.get("succeeded"))
