"""Options every client command spells the same way: a checked `--url`, and `-o json` (and
`-o table` where the output is a list, as etcdctl's `-w table`)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def http_url(text: str) -> str:
    """An argparse type: one http(s) URL, or several separated by commas (kept as given),
    so that `--url 127.0.0.1:8080` is a usage error, not a failed connection."""
    for part in text.split(","):
        if not part.strip().lower().startswith(("http://", "https://")):
            raise argparse.ArgumentTypeError(
                f"{part!r} is not an http:// or https:// URL (e.g. http://{part.strip()})"
            )
    return text


def positive_seconds(text: str) -> float:
    """An argparse type: seconds above 0 (`--timeout 0` would time every request out at
    once, and then retry it for the whole retry budget)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds above 0")
    return value


def output_args(
    p: argparse.ArgumentParser, json_help: str = "print JSON", *, table: bool = False
) -> None:
    """`-o json|text` (and its older spelling `--json`) on a command that prints data;
    `table` adds `-o table` (only where the command prints one)."""
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "table") if table else ("text", "json"),
        default="text",
        help=f"text (default) or json: {json_help}"
        + ("; table: a bordered table, as etcdctl -w table" if table else ""),
    )
    p.add_argument("--json", action="store_true", help="the same as -o json")


def json_output(args: argparse.Namespace) -> bool:
    return bool(args.json or args.output == "json")


def table_output(args: argparse.Namespace) -> bool:
    return not getattr(args, "json", False) and args.output == "table"


def cell(raw: bytes | str | None) -> str:
    """One table cell: bytes as UTF-8 (undecodable bytes as \\xNN), and line breaks and
    tabs escaped, so that one row stays one line."""
    if raw is None:
        return ""
    if isinstance(raw, bytes):  # a literal backslash doubled first, so \\xNN is unambiguous
        text = raw.replace(b"\\", b"\\\\").decode(errors="backslashreplace")
    else:
        text = raw.replace("\\", "\\\\")
    return text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def render_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """etcdctl's `-w table` shape: a bordered table, the header upper-cased."""
    widths = [len(h) for h in header]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r, strict=True)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c:<{w}} " for c, w in zip(cells, widths, strict=True)) + "|"

    out = [rule, line([h.upper() for h in header]), rule, *(line(r) for r in rows), rule]
    return "\n".join(out) + "\n"
