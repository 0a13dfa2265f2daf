"""`mercury usage`: per-producer usage — totals since the store began, or over a window
(``--since 24h``) with a unicode sparkline of writes per producer, from
`GET /v1/usage` and `GET /v1/usage/series`; `mercury usage unused [--producer P]
[--days N]`: the keys nobody read, from `GET /v1/usage/unused` (docs/usage.md)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from core.errors import ConfigError
from mercury import adminclient
from mercury.cliopts import json_output, output_args

BARS = "▁▂▃▄▅▆▇█"
#: Cells of a sparkline: points are summed into this many bins.
SPARK_WIDTH = 48


def register(sub: Any) -> None:
    """Add `mercury usage` to the `mercury` parser."""
    up = sub.add_parser(
        "usage",
        help="per-producer usage: totals, or over a window with sparklines",
        description="Without --since: keys, bytes, writes, deletes, duplicates, throttled "
        "ops, expiries and the share of the storage cap per producer, since the store began. With "
        "--since: what each producer did in that window (writes, bytes written, deletes, "
        "duplicates, held, refused, expiries, stored-bytes growth) and a sparkline of its writes. "
        "`mercury usage unused`: per producer and keyspace, the keys no node read for "
        "--days days and the bytes they hold; with --producer, those keys themselves.",
    )
    up.add_argument(
        "report", nargs="?", choices=("unused",), help="unused: keys nobody reads (see above)"
    )
    adminclient.client_args(up)
    up.add_argument(
        "--since",
        help="window start: relative (24h, 7d, 90m) or RFC 3339 (2026-11-23T10:00:00Z)",
    )
    up.add_argument("--producer", help="only this producer")
    output_args(up, "the JSON report")
    up.add_argument(
        "--days",
        type=float,
        default=30.0,
        help="unused: not read on any node for this many days (default 30; fractions allowed)",
    )
    up.add_argument("--keyspace", help="unused: only this keyspace of --producer")
    up.add_argument(
        "--limit", type=int, default=100, help="unused: list at most this many keys (default 100)"
    )
    up.set_defaults(func=_usage)


def sparkline(values: Sequence[int], width: int = SPARK_WIDTH) -> str:
    """`values` summed into at most `width` bins, one bar each (a space for zero)."""
    if not values:
        return ""
    n = min(width, len(values))
    bins = [0] * n
    for i, v in enumerate(values):
        bins[i * n // len(values)] += v
    top = max(bins)
    if top <= 0:
        return " " * n
    return "".join(" " if b <= 0 else BARS[min(7, (b * 8 - 1) // top)] for b in bins)


def _since(s: str) -> str:
    """`24h` means the last 24 hours: the API's relative form is `-24h`. Anything that is
    neither a duration nor an RFC 3339 time is a usage error naming what was given (never
    sent on as `-yesterday`)."""
    if s == "now" or "T" in s:
        return s
    if not re.fullmatch(r"-?\d+[smhd]", s.strip()):
        raise ConfigError(
            f"--since {s!r}: expected a duration such as 90m, 24h, 7d, or an RFC 3339 time "
            "such as 2026-11-23T10:00:00Z"
        )
    return s.strip() if s.strip().startswith("-") else "-" + s.strip()


def _table(cols: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> None:
    """Columns right-aligned but the first and the last `left - 1` (names, sparklines)."""
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lefts = {0, *range(len(cols) - left + 1, len(cols))}
    for r in [cols, *rows]:
        cells = [
            v.ljust(w) if i in lefts else v.rjust(w)
            for i, (v, w) in enumerate(zip(r, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())


def _usage(args: argparse.Namespace) -> int:
    if args.since:
        _since(args.since)  # a malformed window fails before anything is asked
    if args.report == "unused":
        return _unused(args)
    with adminclient.client(args) as c:
        report = adminclient.check(c.get("/v1/usage"))
        rows = [r for r in report["producers"] if args.producer in (None, r["producer"])]
        if args.since is None:
            if json_output(args):
                out = orjson.dumps({"producers": rows}, option=orjson.OPT_INDENT_2)
                sys.stdout.write(out.decode() + "\n")
                return 0
            cols = (
                "producer",
                "keys",
                "bytes",
                "writes",
                "deletes",
                "duplicates",
                "throttled",
                "expiries",
            )
            table = [[str(r.get(k, "")) for k in cols] for r in rows]
            cap = [_pct(r.get("used_pct")) for r in rows]
            _table((*cols, "used"), [[*t, u] for t, u in zip(table, cap, strict=True)])
            return 0
        windows = []
        for r in rows:
            s = adminclient.check(
                c.get(
                    "/v1/usage/series",
                    params={"producer": r["producer"], "since": _since(args.since)},
                )
            )
            windows.append((r, s))
    out_rows = [_window(r, s) for r, s in windows]
    if json_output(args):
        doc = {"since": _since(args.since), "producers": out_rows}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    cols = WINDOW_COLS
    _table(
        (*cols, "bytes", "growth", "used", "writes over time"),
        [
            [
                *(str(w[k]) for k in cols),
                str(w["bytes"]),
                f"{w['growth']:+d}",
                _pct(w["used_pct"]),
                w["sparkline"],
            ]
            for w in out_rows
        ],
        left=2,
    )
    if out_rows and not args.quiet:
        step = windows[0][1]["step"]
        print(f"(since {args.since}; one bar = {_bar_span(len(windows[0][1]['points']), step)})")
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}%"


def _bar_span(n_points: int, step: str) -> str:
    per = max(1, -(-n_points // SPARK_WIDTH))
    return f"{per} x {step}"


#: The columns of a window's table (`--since`): counters summed over the window; expiries
#: (keys the root expired at their deadline) apart from the producer's own deletes.
WINDOW_COLS = (
    "producer",
    "writes",
    "bytes_written",
    "deletes",
    "duplicates",
    "held",
    "refused",
    "expiries",
)


def _window(row: dict[str, Any], s: dict[str, Any]) -> dict[str, Any]:
    """One producer's totals over the series' window."""
    pts = s["points"]
    stored = [p["bytes"] for p in pts if p["bytes"] is not None]
    out: dict[str, Any] = {"producer": row["producer"], "step": s["step"]}
    for k in WINDOW_COLS[1:]:
        # .get: a root from before a column answers without it
        out[k] = sum(p.get(k) or 0 for p in pts)
    out["bytes"] = row["bytes"]
    began = (s.get("start") or {}).get("bytes")
    out["growth"] = stored[-1] - (began if began is not None else stored[0]) if stored else 0
    out["used_pct"] = row.get("used_pct")
    out["sparkline"] = sparkline([p["writes"] or 0 for p in pts])
    return out


def _unused(args: argparse.Namespace) -> int:
    """The summary per producer/keyspace; with --producer, also its unused keys (pages of
    `GET /v1/usage/unused` followed up to --limit keys)."""
    params: dict[str, Any] = {"days": args.days}
    if args.producer:
        params["producer"] = args.producer
    with adminclient.client(args) as c:
        summary = adminclient.check(c.get("/v1/usage/unused/summary", params=params))
        rows = [r for r in summary["rows"] if args.keyspace in (None, r["keyspace"])]
        keys: list[dict[str, Any]] = []
        more = False
        if args.producer:
            q = dict(params, limit=min(max(args.limit, 1), 10_000))
            if args.keyspace:
                q["keyspace"] = args.keyspace
            while True:
                page = adminclient.check(c.get("/v1/usage/unused", params=q))
                keys += page["keys"]
                more = page["next_cursor"] is not None
                if not more or len(keys) >= args.limit:
                    break
                q["cursor"] = page["next_cursor"]
            more = more or len(keys) > args.limit
            keys = keys[: args.limit]
    if json_output(args):
        doc = {**summary, "rows": rows, **({"keys": keys} if args.producer else {})}
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    cols = ("producer", "keyspace", "keys", "unused_keys", "unused_bytes", "too_new")
    if rows:
        _table(cols, [[str(r[k]) for k in cols] for r in rows], left=2)
    note = "" if summary["complete"] else " (incomplete: tracking began later, or reads dropped)"
    if not args.quiet:
        print(f"(not read on any node for {args.days:g} days{note}; too_new: written since)")
    if args.producer and keys:
        print()
        table = [[k.get("key") or "b64:" + k["key_b64"], str(k["bytes"]), str(k["version"])]
                 for k in keys]  # fmt: skip
        _table(("key", "bytes", "version"), table)
        if more and not args.quiet:
            print(f"(first {args.limit} keys; --limit N for more, --json for all fields)")
    return 0
