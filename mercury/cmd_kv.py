"""`mercury kv`: read and write keys from the shell through the SDK (`mercury_client`).

Exit statuses (also in `mercury kv --help`): 0 done, 2 usage (bad arguments or input
file, a URL that reaches no Mercury API), 3 not found, 4 refused (any other 4xx: forbidden,
too large, over quota after the retries...), 5 unavailable (connection failed or cut,
timeout, 5xx). Every failure is one line naming what failed and, where one helps, a hint.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import itertools
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

from mercury.cli import failed_url, transport_message
from mercury.cliopts import cell, http_url, positive_seconds, render_table
from mercury_client import (
    Client,
    Gone,
    MercuryClientError,
    NoSuchRoute,
    NotFound,
    Refused,
    RetryPolicy,
    wire,
)
from mercury_client.retry import DEFAULT_BUDGET_S, DEFAULT_POLICY

OK, USAGE, NOT_FOUND, REFUSED, UNAVAILABLE = 0, 2, 3, 4, 5

EXIT_HELP = """\
exit status:
  0  done
  2  usage: bad arguments, unreadable or malformed input file, or a URL that reaches
     no Mercury API (a 404 for the path itself: check --url / --read-url)
  3  not found: the key is absent (get; with several keys, any of them)
  4  refused: the node answered 4xx (unauthorized, forbidden, too large, over quota after
     the retries, ...); the same request will not succeed unchanged
  5  unavailable: connection refused or cut, timeout, or a 5xx answer

environment: MERCURY_URL, MERCURY_READ_URL, MERCURY_TOKEN_FILE give the defaults of
--url, --read-url and --token-file; MERCURY_TOKEN holds the token itself (used when no
token file is given).
"""

#: Bad records an import reports before it stops looking (all are checked before a write).
MAX_REPORTED = 20

#: Records of an import file per batch request (and per checkpoint). A request of as many
#: ops as the root's batch limit (10,000 by default) commits at once instead of waiting for
#: the batch window, so large requests import fastest (see docs/client.md).
IMPORT_BATCH = 10_000


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument(
        "--url",
        type=http_url,
        default=os.environ.get("MERCURY_URL", "http://127.0.0.1:8080"),
        metavar="URL[,URL...]",
        help="the root's gateway URL, for writes, or every HA candidate's, comma-separated "
        "(the leader is found and followed; default $MERCURY_URL or http://127.0.0.1:8080)",
    )
    g.add_argument(
        "--read-url",
        type=http_url,
        default=os.environ.get("MERCURY_READ_URL"),
        help="a replica or consumer node, for ls/export/watch/get (default $MERCURY_READ_URL, "
        "else --url)",
    )
    g.add_argument(
        "--token-file",
        default=os.environ.get("MERCURY_TOKEN_FILE"),
        help="file holding the producer's bearer token (default $MERCURY_TOKEN_FILE; "
        "else the token in $MERCURY_TOKEN)",
    )
    g.add_argument("--ca", help="CA bundle (PEM) that verifies the node's TLS certificate")
    g.add_argument("--cert", help="client certificate (PEM) for mutual TLS")
    g.add_argument("--key", dest="cert_key", help="private key (PEM) of --cert")
    g.add_argument(
        "--timeout",
        type=positive_seconds,
        default=30.0,
        help="seconds per network wait (default 30)",
    )
    g.add_argument(
        "--retries",
        type=int,
        default=None,
        help="rounds per request in all, a round one try of each --url (default: 6, and "
        f"on while the waits between rounds are under {DEFAULT_BUDGET_S:.0f} s: one HA "
        "failover)",
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only data and errors (no summaries, write results or progress)",
    )


def _output(p: argparse.ArgumentParser, text: str, json_: str) -> None:
    p.add_argument(
        "-o",
        "--output",
        choices=("text", "json", "table"),
        default="text",
        help=f"text: {text} (default); json: {json_}; table: a bordered table, as etcdctl "
        "-w table (read whole before it prints)",
    )


def register(sub: Any) -> None:
    """Add `mercury kv` and its subcommands to the `mercury` parser."""
    kv = sub.add_parser(
        "kv",
        help="read and write keys (put, get, del, ls, import, export, watch)",
        description="Read and write keys through the HTTP API: writes go to the root "
        "(--url), range reads and watches to a replica (--read-url). Every write carries an "
        "Idempotency-Key, so the automatic retries never write twice.",
        epilog=EXIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ks = kv.add_subparsers(dest="kv_command", required=True, metavar="KV_COMMAND")

    def add(name: str, help_: str, aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = ks.add_parser(
            name,
            aliases=list(aliases),
            help=help_,
            description=help_,
            epilog=EXIT_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _common(p)
        return p

    p = add("put", "write KEY (the value from VALUE, or stdin when VALUE is - or omitted)")
    p.add_argument("key", metavar="KEY")
    p.add_argument("value", metavar="VALUE", nargs="?", default="-")
    cond = p.add_mutually_exclusive_group()
    cond.add_argument(
        "--if-seq", type=int, help="only if KEY's current seq is this one (else exit 4)"
    )
    cond.add_argument("--if-absent", action="store_true", help="create only (else exit 4)")
    exp = p.add_mutually_exclusive_group()
    exp.add_argument(
        "--ttl",
        metavar="D",
        help="KEY expires after D: 90s, 5m, 1h, 1h30m, 2d or seconds (1 s to one year); "
        "a put without --ttl clears KEY's deadline",
    )
    exp.add_argument("--expires-at", metavar="T", help="KEY expires at T (RFC 3339)")
    p.set_defaults(func=_run(_put))

    p = add(
        "get",
        "print KEY's value (raw bytes, no newline added); exit 3 when absent. Several KEYs "
        "(one get_bulk request) or --prefix print JSON lines {key, value} (null when absent)",
    )
    p.add_argument("keys", metavar="KEY", nargs="+")
    p.add_argument(
        "--prefix", action="store_true", help="KEY is a prefix: every key under it, JSON lines"
    )
    _output(
        p, "the value's bytes", '{"key", "value", "seq"} (seq: the key\'s version, for --if-seq)'
    )
    p.set_defaults(func=_run(_get))

    p = add("del", "delete KEY (or every key under it with --prefix)", ("delete", "rm"))
    p.add_argument("key", metavar="KEY")
    p.add_argument("--if-seq", type=int, help="only if KEY's current seq is this one (else exit 4)")
    p.add_argument(
        "--prefix",
        action="store_true",
        help="delete every key under KEY (a prefix inside the producer's keyspaces): one "
        "request per batch's worth, until none remains; not atomic",
    )
    p.set_defaults(func=_run(_del))

    p = add(
        "ls",
        "list the keys under PREFIX (every key when PREFIX is omitted or empty), one a line, "
        "or JSON lines with --values or -o json",
    )
    p.add_argument("prefix", metavar="PREFIX", nargs="?", default="")
    p.add_argument("--values", action="store_true", help="JSON lines {key, value} instead")
    _output(p, "one key a line", "JSON lines {key} ({key, value} with --values)")
    p.set_defaults(func=_run(_ls))

    p = add(
        "import",
        "write the records of FILE — JSON lines, or one JSON array — each "
        '{key|key_b64, value|value_b64} or {"op": "delete", key} (a "base64": true member '
        "says value is base64, as wrangler writes it) in batches; every record is checked "
        "before the first write, and every bad one reported; resumable: a checkpoint file "
        "records the records acknowledged, and each batch's Idempotency-Key derives from the "
        "file's SHA-256 and its record numbers, so a rerun skips what was done and never "
        "writes a batch twice. FILE - (or a pipe) is read whole into a temporary file first: "
        "a rerun then resumes by the Idempotency-Keys alone (no checkpoint)",
    )
    p.add_argument("file", metavar="FILE", type=Path)
    p.add_argument(
        "--batch-size",
        type=int,
        default=IMPORT_BATCH,
        help=f"records per request and checkpoint at most (default {IMPORT_BATCH:,}); "
        "smaller when the root's 413 names a smaller bound (e.g. a rate quota's)",
    )
    p.add_argument(
        "--base64-values",
        action="store_true",
        help="every value member is base64 (consul kv export's format)",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="progress file (default FILE.mercury-import); removed when the import completes",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr, moved as each request is acknowledged (default: when "
        "stderr is a terminal)",
    )
    p.set_defaults(func=_run(_import))

    p = add(
        "export",
        "print every key under PREFIX as JSON lines (the form import reads), as it was at "
        "one log seq of the read node (printed on stderr)",
    )
    p.add_argument("prefix", metavar="PREFIX", nargs="?", default="")
    p.set_defaults(func=_run(_export))

    p = add("watch", "print changes under PREFIX as JSON lines as they happen (Ctrl-C ends)")
    p.add_argument("prefix", metavar="PREFIX")
    p.add_argument(
        "--from-seq",
        type=int,
        default=None,
        help="first log seq to show (default: changes from now on; an `export` at seq S "
        "continues with --from-seq S+1)",
    )
    p.set_defaults(func=_run(_watch))


# --- running a command -----------------------------------------------------------------------


class UsageError(Exception):
    """Bad input the user must fix (exit 2)."""


def exit_status(err: MercuryClientError) -> int:
    """The exit status of a failed request."""
    if isinstance(err, NoSuchRoute):
        return USAGE  # a wrong --url / --read-url: the user must fix the command
    if isinstance(err, NotFound):
        return NOT_FOUND
    if isinstance(err, Refused):
        return REFUSED
    return UNAVAILABLE


def describe(err: MercuryClientError, args: argparse.Namespace) -> str:
    """A failed request as one line: what failed (the URL when no answer came), the node's
    detail, and a hint (the node's, or one naming the flag to fix)."""
    body = err.body if isinstance(err.body, dict) else {}
    hint = body.get("hint")
    cause = err.__cause__
    if err.status == 0 and isinstance(cause, BaseException):
        url = failed_url(cause)
        read = bool(args.read_url) and url.startswith(str(args.read_url).rstrip("/"))
        # names the URL, the cause and a hint
        return transport_message(cause, "--read-url" if read else "--url")
    if isinstance(err, NoSuchRoute):
        hint = (
            "no Mercury API at that path: check --url / --read-url "
            f"(now {args.url}{' and ' + args.read_url if args.read_url else ''}; no path "
            "after HOST:PORT)"
        )
    elif err.status == 421:
        nodes = body.get("consumer_nodes") or []
        where = f" (the root names {', '.join(nodes)})" if nodes else ""
        hint = (
            f"range and bulk reads are served by replicas: give --read-url or set "
            f"MERCURY_READ_URL to a replica's URL{where}"
        )
    elif err.status == 401 and args.token is None:
        hint = "no token given: --token-file FILE, or $MERCURY_TOKEN_FILE or $MERCURY_TOKEN"
    elif isinstance(err, Gone):
        hint = (
            "`mercury kv export PREFIX` prints the keys at one seq S (on stderr); then "
            "`mercury kv watch PREFIX --from-seq S+1`"
        )
    return f"{err}" + (f" (hint: {hint})" if hint else "")


def _run(cmd: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            with _client(args) as client:
                return int(cmd(client, args))
        except UsageError as err:
            print(f"mercury kv: {err}", file=sys.stderr)
            return USAGE
        except MercuryClientError as err:
            print(f"mercury kv: {describe(err, args)}", file=sys.stderr)
            return exit_status(err)
        except BrokenPipeError:  # e.g. `mercury kv ls P | head`
            sys.stderr.close()
            return OK
        except OSError as err:  # a local file: the import file, its checkpoint
            print(f"mercury kv: {err}", file=sys.stderr)
            return USAGE

    return run


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            return Path(args.token_file).read_text().strip()
        except OSError as err:
            raise UsageError(f"cannot read --token-file {args.token_file}: {err.strerror}") from err
    return os.environ.get("MERCURY_TOKEN") or None


def _client(args: argparse.Namespace) -> Client:
    args.token = token = _token(args)
    if args.cert_key and not args.cert:
        raise UsageError("--key needs --cert")
    cert: str | tuple[str, str] | None = (
        (args.cert, args.cert_key) if args.cert and args.cert_key else args.cert
    )
    if args.retries is not None and args.retries < 1:
        raise UsageError("--retries must be at least 1")
    try:
        return Client(
            args.url,
            token,
            read_url=args.read_url,
            read_token=token if args.read_url else None,
            verify=args.ca or True,
            cert=cert,
            timeout=args.timeout,
            retries=DEFAULT_POLICY if args.retries is None else RetryPolicy(args.retries),
            # one request per import batch (still cut to 8 MiB, or smaller after a 413)
            batch_ops=max(1, getattr(args, "batch_size", 0) or wire.DEFAULT_BATCH_OPS),
        )
    except (OSError, ValueError) as err:  # unreadable CA / certificate
        raise UsageError(f"TLS files: {err}") from err


def _out() -> BinaryIO:
    return sys.stdout.buffer


def _json_line(doc: dict[str, Any]) -> None:
    _out().write(json.dumps(doc, ensure_ascii=False).encode() + b"\n")
    _out().flush()


def _put_bytes(doc: dict[str, Any], name: str, raw: bytes) -> None:
    try:
        doc[name] = raw.decode()
    except UnicodeDecodeError:
        doc[name + "_b64"] = base64.b64encode(raw).decode()


def _note(args: argparse.Namespace, text: str) -> None:
    """A line for the user on stderr (not with --quiet)."""
    if not args.quiet:
        print(text, file=sys.stderr)


# --- commands --------------------------------------------------------------------------------


def _put(client: Client, args: argparse.Namespace) -> int:
    value = sys.stdin.buffer.read() if args.value == "-" else args.value.encode()
    r = client.put(
        args.key,
        value,
        if_seq=args.if_seq,
        if_absent=args.if_absent,
        ttl=args.ttl,
        expires_at=args.expires_at,
    )
    if not args.quiet:
        _json_line({"seq": r.seq, "status": r.status})
    return OK


def _get(client: Client, args: argparse.Namespace) -> int:
    table = args.output == "table"
    if args.prefix:
        for prefix in args.keys:
            _print_items(client.range(prefix), "table" if table else "json")
        return OK
    if len(args.keys) > 1:
        values = client.get_many(args.keys)
        if table:
            keys = dict.fromkeys(wire.as_bytes(k) for k in args.keys)
            rows = [[cell(k), cell(values.get(k))] for k in keys]
            _out().write(render_table(("key", "value"), rows).encode())
            _out().flush()
            return NOT_FOUND if any(v is None for v in values.values()) else OK
        for k in dict.fromkeys(wire.as_bytes(k) for k in args.keys):
            doc: dict[str, Any] = {}
            _put_bytes(doc, "key", k)
            v = values.get(k)
            if v is None:
                doc["value"] = None
            else:
                _put_bytes(doc, "value", v)
            _json_line(doc)
        absent = [k for k, v in values.items() if v is None]
        return NOT_FOUND if absent else OK
    key = args.keys[0]
    got = client.get_with_seq(key)
    if got is None:
        print(f"mercury kv: no key {key!r} at {args.read_url or args.url}", file=sys.stderr)
        return NOT_FOUND
    if args.output == "json":
        doc = {}
        _put_bytes(doc, "key", key.encode())
        _put_bytes(doc, "value", got.value)
        doc["seq"] = got.seq
        _json_line(doc)
        return OK
    if table:
        row = [cell(key), cell(got.value), str(got.seq)]
        _out().write(render_table(("key", "value", "seq"), [row]).encode())
        _out().flush()
        return OK
    _out().write(got.value)
    _out().flush()
    return OK


def _del(client: Client, args: argparse.Namespace) -> int:
    if args.prefix:
        if args.if_seq is not None:
            raise UsageError("--if-seq is for one key, not with --prefix")
        total = client.delete_prefix(args.key)
        if not args.quiet:
            _json_line({"seq": total.seq, "deleted": total.deleted, "requests": total.requests})
        return OK
    r = client.delete(args.key, if_seq=args.if_seq)
    if not args.quiet:
        _json_line({"seq": r.seq, "status": r.status})
    return OK


def _ls(client: Client, args: argparse.Namespace) -> int:
    if args.output == "table":
        mode = "table"
    else:
        mode = "json" if args.values or args.output == "json" else "text"
    _print_items(client.range(args.prefix or None, keys_only=not args.values), mode)
    return OK


def _print_items(items: Iterator[wire.Item], mode: str) -> int:
    """Print `items` as `mode` ("text": one key a line, "json": JSON lines, "table": one
    table, so the items are read whole first)."""
    if mode == "table":
        got = list(items)
        if any(it.value is not None for it in got):
            rows = [[cell(it.key), cell(it.value)] for it in got]
            _out().write(render_table(("key", "value"), rows).encode())
        else:
            _out().write(render_table(("key",), [[cell(it.key)] for it in got]).encode())
        _out().flush()
        return len(got)
    n = 0
    for it in items:
        if mode == "json":
            doc: dict[str, Any] = {}
            _put_bytes(doc, "key", it.key)
            if it.value is not None:
                _put_bytes(doc, "value", it.value)
            _out().write(json.dumps(doc, ensure_ascii=False).encode() + b"\n")
        else:
            _out().write(it.key + b"\n")
        n += 1
    _out().flush()
    return n


def _export(client: Client, args: argparse.Namespace) -> int:
    # One seq for the whole export (Client.snapshot), so it never mixes two moments of the
    # prefix; the seq goes to stderr, where `watch --from-seq` can take over from.
    snap = client.snapshot(args.prefix)
    n = _print_items(snap.items, "json")
    _note(args, f"exported {n} keys at seq {snap.seq}")
    return OK


def _watch(client: Client, args: argparse.Namespace) -> int:
    for c in client.watch(args.prefix, from_seq=args.from_seq):
        doc: dict[str, Any] = {"seq": c.seq, "op": c.op}
        _put_bytes(doc, "key", c.key)
        if c.value is not None:
            _put_bytes(doc, "value", c.value)
        _json_line(doc)
    return OK


# --- import ----------------------------------------------------------------------------------

Op = tuple[str, bytes, bytes | None]


def parse_record(doc: Any, *, base64_values: bool = False) -> Op:
    """One import record as (op, key, value); ValueError saying what is wrong with it."""
    if not isinstance(doc, dict):
        raise ValueError(f"a record is a JSON object, not {_kind(doc)}")
    op = doc.get("op", "set")
    if op not in ("set", "delete"):
        raise ValueError(f"op must be set or delete, got {op!r}")
    key = _field(doc, "key", False)
    if key is None:
        raise ValueError("no key (a string) or key_b64")
    if not key:
        raise ValueError("the key is empty")
    if op == "delete":
        return op, key, None
    b64 = base64_values or doc.get("base64") is True  # wrangler: "base64": true
    value = _field(doc, "value", b64)
    if value is None:
        raise ValueError("no value (a string) or value_b64")
    return op, key, value


def parse_line(line: bytes, lineno: int) -> Op:
    """One import line as (op, key, value); UsageError naming the line when malformed."""
    try:
        return parse_record(json.loads(line))
    except (ValueError, TypeError) as err:
        raise UsageError(f"line {lineno}: {err}") from err


def _kind(v: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if v is None:
        return "null"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return "a number"
    return names.get(type(v), type(v).__name__)


def _field(doc: dict[str, Any], name: str, b64: bool) -> bytes | None:
    v = doc.get(name)
    if v is not None and not isinstance(v, str):
        raise ValueError(
            f"{name} must be a string, not {_kind(v)} (write {json.dumps(str(v))} for text, "
            f"or {name}_b64 for bytes)"
        )
    if isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True) if b64 else v.encode()
        except ValueError as err:
            raise ValueError(f"{name} is not base64: {err}") from err
    b = doc.get(name + "_b64")
    if b is not None and not isinstance(b, str):
        raise ValueError(f"{name}_b64 must be a base64 string, not {_kind(b)}")
    if isinstance(b, str):
        try:
            return base64.b64decode(b, validate=True)
        except ValueError as err:
            raise ValueError(f"{name}_b64 is not base64: {err}") from err
    return None


def _is_array(path: Path) -> bool:
    """Whether FILE is one JSON array (its first non-blank byte is `[`), not JSON lines."""
    with path.open("rb") as f:
        while chunk := f.read(4096):
            s = chunk.lstrip()
            if s:
                return s[:1] == b"["
    return False


def _records(path: Path, b64: bool) -> Iterator[tuple[str, Op | str]]:
    """(where, op or what is wrong) of every record of FILE, in order: `line N` of JSON
    lines (blank lines skipped), `record N` of a JSON array (read whole: arrays are the
    small bulk formats of other stores; JSON lines stream)."""
    if _is_array(path):
        try:
            docs = json.loads(path.read_bytes())
        except ValueError as err:
            yield "the file", f"not a JSON array: {err}"
            return
        if not isinstance(docs, list):
            yield "the file", f"a JSON array of records, not {_kind(docs)}"
            return
        for i, doc in enumerate(docs, 1):
            yield from _checked(f"record {i}", lambda d=doc: d, b64)
        return
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield from _checked(f"line {lineno}", lambda ln=line: json.loads(ln), b64)


def _checked(where: str, load: Any, b64: bool) -> Iterator[tuple[str, Op | str]]:
    try:
        yield where, parse_record(load(), base64_values=b64)
    except json.JSONDecodeError as err:
        yield where, f"not JSON: {err.msg} at column {err.colno}"
    except (ValueError, TypeError) as err:
        yield where, str(err)


def _scan(path: Path, b64: bool, shown: str | None = None) -> tuple[str, int]:
    """The file's SHA-256 and its number of records; every record is checked before any
    write, and every bad one reported (the first `MAX_REPORTED`) in one UsageError."""
    h = hashlib.sha256()
    n = 0
    bad: list[str] = []
    try:
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        for where, rec in _records(path, b64):
            if isinstance(rec, str):
                bad.append(f"{where}: {rec}")
            n += 1
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err.strerror or err}") from err
    if bad:
        listed = "\n  ".join(bad[:MAX_REPORTED])
        more = f"\n  ... and {len(bad) - MAX_REPORTED} more" if len(bad) > MAX_REPORTED else ""
        raise UsageError(
            f"{shown or path}: {len(bad)} bad record(s), nothing written:\n  {listed}{more}"
        )
    return h.hexdigest(), n


def _import(client: Client, args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if str(args.file) != "-" and (not args.file.exists() or args.file.is_file()):
        return _import_file(client, args)
    # stdin or a pipe (/dev/stdin, <(...)): the import reads FILE twice (every record is
    # checked before the first write), and a second read of a pipe finds it empty.
    with tempfile.TemporaryDirectory(prefix="mercury-import-") as tmp:
        spool = Path(tmp) / "stdin.jsonl"
        try:
            with spool.open("wb") as out:
                if str(args.file) == "-":
                    shutil.copyfileobj(sys.stdin.buffer, out)
                else:
                    with args.file.open("rb") as src:
                        shutil.copyfileobj(src, out)
        except OSError as err:
            raise UsageError(f"cannot read {args.file}: {err.strerror or err}") from err
        shown = "stdin" if str(args.file) == "-" else str(args.file)
        return _import_file(client, argparse.Namespace(**{**vars(args), "file": spool}), shown)


def _import_file(client: Client, args: argparse.Namespace, shown: str | None = None) -> int:
    """`kv import` of a regular file (read twice: checked whole, then sent); `shown`: the
    name its messages give it (what the user passed, not a spool file)."""
    digest, total = _scan(args.file, args.base64_values, shown)
    ckpt: Path = args.checkpoint or args.file.with_name(args.file.name + ".mercury-import")
    done = 0
    if ckpt.exists():
        try:
            state = json.loads(ckpt.read_text())
        except (OSError, ValueError) as err:
            raise UsageError(f"unreadable checkpoint {ckpt}: {err}") from err
        if state.get("sha256") == digest and state.get("batch_size") == args.batch_size:
            done = int(state.get("records_done", 0))
            # the chunk size in use when it stopped: a batch in flight then is sent again
            # with the same records, under the same Idempotency-Key
            if isinstance(state.get("chunk"), int) and state["chunk"] > 0:
                client.batch_ops = min(client.batch_ops, state["chunk"])
    resumed_at = done
    summary = {"records": total, "resumed_at": resumed_at, "requests": 0, "replayed": 0}
    counts = {"written": 0, "deleted": 0, "duplicates": 0, "absent": 0}
    show = None if args.progress is None else args.progress
    bar = tqdm(
        total=total,
        initial=done,
        unit="key",
        # drawn at every acknowledged request (they are few: at most one per batch window
        # or quota refill), so a slow producer's bar moves as its requests do
        mininterval=0,
        miniters=1,
        disable=True if args.quiet else ((not show) if show is not None else None),
        file=sys.stderr,
    )
    try:
        valid = (
            op for _w, op in _records(args.file, args.base64_values) if not isinstance(op, str)
        )
        ops = itertools.islice(valid, done, None)  # acknowledged before the checkpoint
        while True:
            # Each chunk is as large as the client may send in one request (--batch-size,
            # or a 413's bound it remembers): the checkpoint then follows every request.
            size = max(1, min(args.batch_size, client.batch_ops))
            chunk = list(itertools.islice(ops, size))
            if not chunk:
                break
            done = _import_chunk(client, chunk, digest, done, summary, counts, ckpt, args, bar)
    finally:
        bar.close()
    ckpt.unlink(missing_ok=True)
    if not args.quiet:
        _json_line({**summary, **counts})
    return OK


def _import_chunk(
    client: Client,
    chunk: list[Op],
    digest: str,
    done: int,
    summary: dict[str, int],
    counts: dict[str, int],
    ckpt: Path,
    args: argparse.Namespace,
    bar: Any,
) -> int:
    """Send records ``done+1 .. done+len(chunk)`` under a key that names them, then record
    the progress (a crash in between replays the batch's first answer on the rerun)."""
    idem = f"import:{digest[:32]}:{done + 1}-{done + len(chunk)}"
    r = client.batch(chunk, idempotency_key=idem, on_done=bar.update)
    summary["requests"] += r.requests
    summary["replayed"] += r.replayed
    for k in counts:
        counts[k] += getattr(r, k)
    done += len(chunk)
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    state = {
        "sha256": digest,
        "batch_size": args.batch_size,
        "records_done": done,
        "chunk": client.batch_ops,
    }
    tmp.write_text(json.dumps(state))
    os.replace(tmp, ckpt)
    return done
