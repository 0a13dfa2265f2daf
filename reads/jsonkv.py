"""How keys and values travel in the read API's JSON: UTF-8 text when they are valid
UTF-8, otherwise base64 under a ``_b64`` name (docs/api.md)."""

from __future__ import annotations

import base64
from typing import Any

from core import ttl
from store.ops import Value


def put_bytes(doc: dict[str, Any], name: str, raw: bytes) -> None:
    """Set ``doc[name]`` to `raw` as text, or ``doc[name + "_b64"]`` when not UTF-8."""
    try:
        doc[name] = raw.decode()
    except UnicodeDecodeError:
        doc[name + "_b64"] = base64.b64encode(raw).decode()


def item(key: bytes, value: Value | None) -> dict[str, Any]:
    """One range item: ``{"key", "value"}`` (value omitted for keys_only, `_b64` names for
    non-UTF-8 bytes), and ``expires_at`` (RFC 3339) when the key has a deadline."""
    doc: dict[str, Any] = {}
    put_bytes(doc, "key", key)
    if value is not None:
        put_bytes(doc, "value", value.value)
        if value.expires_us:
            doc["expires_at"] = ttl.rfc3339(value.expires_us)
    return doc
