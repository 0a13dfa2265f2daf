"""The ACL as a document: validation of a whole document (every problem listed), its diff,
and the YAML that `mercury acl apply` reads. Pure: nothing here does I/O.

Document (YAML for `acl apply`, JSON for ``PUT /v1/admin/acl``)::

    producers:
      team-a:
        keyspaces: ["a/"]
        shared: []
        quota: {ops_per_s: 100, burst: 200, bytes_per_s: 1000000, max_delay_ms: 1000,
                max_bytes_stored: 100000000, shadow: false}
        guards: {"a/": {refuse_empty: true, max_deletes_per_batch: 100}}
    consumers:
      edge: {keyspaces: ["a/"]}

Tokens are not part of it (they are issued by the API, shown once, and kept across a
document PUT). `parse`, `diff` and `steps` are the per-producer form used before the
document PUT existed (a sequence of per-producer calls ordered so no intermediate state
overlaps); the server now commits the whole document at once.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import yaml

from acl.model import Acl, Consumer, Producer, consumer_from_config, given, producer_from_config
from core.errors import AclDocError, BadRequestError


@dataclass(frozen=True, slots=True)
class Change:
    """One step of a diff: `kind` is "create", "update" or "remove"."""

    kind: str
    name: str
    config: dict[str, Any] | None
    details: tuple[str, ...] = ()

    def line(self) -> str:
        """How `acl apply` prints it."""
        sign = {"create": "+", "update": "~", "remove": "-"}[self.kind]
        extra = ("  " + "; ".join(self.details)) if self.details else ""
        return f"{sign} producer {self.name}{extra}"


def normalize(name: str, d: dict[str, Any]) -> dict[str, Any]:
    """A producer's config in the comparable form the admin API returns."""
    cfg = producer_from_config(name, d).config()
    cfg.pop("token_ids", None)
    cfg.pop("name", None)
    return cfg


def _load(text: str, source: str) -> Any:
    """The YAML document `text`; a YAML error is one line naming `source` and where."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = ""
        mark = getattr(err, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        what = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise AclDocError(f"{source} is not valid YAML{where}: {what}") from err


def parse(text: str, source: str = "ACL document") -> dict[str, dict[str, Any]]:
    """Desired producers (name -> normalized config) from a YAML document."""
    doc = _load(text, source)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict) or set(doc) - {"producers"}:
        raise AclDocError('ACL document must be a mapping with one key, "producers"')
    producers = given(doc, "producers", {})
    if not isinstance(producers, dict):
        raise AclDocError('"producers" must map producer names to their configuration')
    out = {}
    for name, cfg in producers.items():
        if not isinstance(cfg, dict):
            raise AclDocError(f"producer {name!r}: configuration must be a mapping")
        unknown = set(cfg) - {"keyspaces", "shared", "quota", "guards"}
        if unknown:
            raise AclDocError(f"producer {name!r}: unknown fields {sorted(unknown)}")
        try:
            out[str(name)] = normalize(str(name), cfg)
        except BadRequestError as err:
            raise AclDocError(str(err.message)) from err
    return out


def _field_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(_field_changes(a, b, f"{prefix}{k}."))
        elif a != b:
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def diff(
    current: dict[str, dict[str, Any]], desired: dict[str, dict[str, Any]], *, prune: bool = True
) -> list[Change]:
    """Steps that turn `current` into `desired`: removals first (they free keyspaces),
    then updates, then creations. Empty when nothing differs (apply is idempotent)."""
    removes = [Change("remove", n, None) for n in sorted(current) if prune and n not in desired]
    updates = [
        Change("update", n, desired[n], tuple(_field_changes(current[n], desired[n])))
        for n in sorted(desired)
        if n in current and current[n] != desired[n]
    ]
    creates = [Change("create", n, desired[n]) for n in sorted(desired) if n not in current]
    return removes + updates + creates


def steps(
    current: dict[str, dict[str, Any]], changes: list[Change]
) -> list[tuple[str, dict[str, Any] | None]]:
    """The admin API calls that carry out `changes`: (producer, config to PUT, or None to
    DELETE), ordered so that no intermediate state overlaps keyspaces the final state
    keeps apart.

    Moving a keyspace from one producer to another must not fail because the receiver
    is updated while the giver still holds it: first the removals, then every update that
    gives up keyspaces gives them up (its current config with only the keyspaces it keeps,
    their shared marks and guards), then the updates that add no keyspace, then the rest
    and the creations. Only a conflict of the final state itself is refused.
    """
    out: list[tuple[str, dict[str, Any] | None]] = []
    later: list[tuple[str, dict[str, Any]]] = []
    for ch in changes:
        if ch.kind == "remove":
            out.append((ch.name, None))
    for ch in changes:
        if ch.kind != "update" or ch.config is None:
            continue
        cur = current[ch.name]
        keep = [k for k in cur.get("keyspaces", []) if k in ch.config.get("keyspaces", [])]
        if len(keep) < len(cur.get("keyspaces", [])):
            out.append(
                (
                    ch.name,
                    {
                        **cur,
                        "keyspaces": keep,
                        "shared": [k for k in cur.get("shared", []) if k in keep],
                        "guards": {k: g for k, g in cur.get("guards", {}).items() if k in keep},
                    },
                )
            )
    for ch in changes:
        if ch.kind == "update" and ch.config is not None:
            adds = set(ch.config.get("keyspaces", [])) - set(current[ch.name].get("keyspaces", []))
            (later if adds else out).append((ch.name, ch.config))
    out.extend(later)
    out.extend((ch.name, ch.config) for ch in changes if ch.kind == "create" and ch.config)
    return out


# --- the ACL as one document (PUT /v1/admin/acl) -------------------------------------------

_PRODUCER_FIELDS = {"keyspaces", "shared", "quota", "guards"}
_CONSUMER_FIELDS = {"keyspaces"}


def check_document(doc: Any) -> tuple[dict[str, Producer], dict[str, Consumer], list[str]]:
    """Validate a whole ACL document ``{"producers": {name: config}, "consumers": {name:
    {"keyspaces"}}}`` (a ``version`` member is ignored: the version travels in If-Match).

    Returns the producers, the consumers and EVERY problem found (empty when valid): a
    caller that gets problems changes nothing and lists them all, so one round trip shows
    what to fix.
    """
    errors: list[str] = []
    producers: dict[str, Producer] = {}
    consumers: dict[str, Consumer] = {}
    if not isinstance(doc, dict):
        return producers, consumers, ["the ACL document must be a JSON object"]
    unknown = set(doc) - {"producers", "consumers", "version"}
    if unknown:
        errors.append(f"unknown members {sorted(unknown)}")
    raw_p = given(doc, "producers", {})
    raw_c = given(doc, "consumers", {})
    if not isinstance(raw_p, dict):
        errors.append('"producers" must map producer names to their configuration')
        raw_p = {}
    if not isinstance(raw_c, dict):
        errors.append('"consumers" must map consumer names to their configuration')
        raw_c = {}
    for name, cfg in raw_p.items():
        if not isinstance(cfg, dict):
            errors.append(f"producer {name!r}: configuration must be an object")
            continue
        bad = set(cfg) - _PRODUCER_FIELDS
        if bad:  # refused, and its known fields still checked: every problem in one answer
            errors.append(f"producer {name!r}: unknown fields {sorted(bad)}")
        try:
            producers[name] = producer_from_config(
                name, {k: v for k, v in cfg.items() if k in _PRODUCER_FIELDS}
            )
        except BadRequestError as err:
            errors.append(f"producer {name!r}: {err.message}")
            # Its keyspaces alone, when they are valid, still show its overlaps.
            with contextlib.suppress(BadRequestError):
                producers[name] = producer_from_config(name, {"keyspaces": cfg.get("keyspaces")})
    names = sorted(producers)
    for i, a in enumerate(names):  # each overlapping pair once, as "a overlaps b"
        others = Acl({n: producers[n] for n in names[i + 1 :]})
        errors.extend(others.grant_problems(producers[a]))
    for name, cfg in raw_c.items():
        if not isinstance(cfg, dict) or set(cfg) - _CONSUMER_FIELDS:
            errors.append(f'consumer {name!r}: configuration must be {{"keyspaces": [...]}}')
            continue
        try:
            consumers[name] = consumer_from_config(name, cfg)
        except BadRequestError as err:
            errors.append(f"consumer {name!r}: {err.message}")
    return producers, consumers, errors


def document_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What replacing document `old` by `new` changes, one line each (``+`` added, ``-``
    removed, ``~`` changed with its fields); empty when they are equal. Both documents are
    in `Acl.document()` form."""
    out: list[str] = []
    for kind in ("producers", "consumers"):
        a, b = old.get(kind, {}), new.get(kind, {})
        what = kind[:-1]
        out.extend(f"- {what} {n}" for n in sorted(set(a) - set(b)))
        for n in sorted(set(a) & set(b)):
            if a[n] != b[n]:
                out.append(f"~ {what} {n}  " + "; ".join(_field_changes(a[n], b[n])))
        out.extend(f"+ {what} {n}" for n in sorted(set(b) - set(a)))
    return out


def parse_document(text: str, source: str = "ACL document") -> dict[str, Any]:
    """A YAML (or JSON) ACL document as given to `mercury acl apply`: ``producers`` and
    ``consumers`` mappings, checked for shape only (the server validates everything)."""
    doc = _load(text, source)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict) or set(doc) - {"producers", "consumers"}:
        raise AclDocError('ACL document must be a mapping of "producers" and "consumers"')
    out: dict[str, Any] = {}
    for kind in ("producers", "consumers"):
        part = given(doc, kind, {})
        if not isinstance(part, dict):
            raise AclDocError(f'"{kind}" must map names to their configuration')
        out[kind] = {str(k): v for k, v in part.items()}
    return out


def merge_kept(current: dict[str, Any], desired: dict[str, Any], *, prune: bool) -> dict[str, Any]:
    """The document `acl apply` PUTs: `desired`, plus (unless `prune`) the producers and
    consumers of `current` that `desired` does not list."""
    if prune:
        return desired
    return {
        kind: {**current.get(kind, {}), **desired.get(kind, {})}
        for kind in ("producers", "consumers")
    }
