"""Options every client command spells the same way: a checked `--url`, and `-o json`."""

from __future__ import annotations

import argparse


def http_url(text: str) -> str:
    """An argparse type: one http(s) URL, or several separated by commas (kept as given),
    so that `--url 127.0.0.1:8080` is a usage error, not a failed connection."""
    for part in text.split(","):
        if not part.strip().lower().startswith(("http://", "https://")):
            raise argparse.ArgumentTypeError(
                f"{part!r} is not an http:// or https:// URL (e.g. http://{part.strip()})"
            )
    return text


def output_args(p: argparse.ArgumentParser, json_help: str = "print JSON") -> None:
    """`-o json|text` (and its older spelling `--json`) on a command that prints data."""
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help=f"text (default) or json: {json_help}",
    )
    p.add_argument("--json", action="store_true", help="the same as -o json")


def json_output(args: argparse.Namespace) -> bool:
    return bool(args.json or args.output == "json")
