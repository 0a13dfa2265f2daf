"""`mercury kv`: read and write keys from the shell through the SDK (`mercury_client`).

Exit statuses (also in `mercury kv --help`): 0 done, 2 usage (bad arguments or input
file), 3 not found, 4 refused (any other 4xx: forbidden, too large, over quota after the
retries...), 5 unavailable (connection failed or cut, timeout, 5xx).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from tqdm import tqdm

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
  2  usage: bad arguments, unreadable or malformed input file
  3  not found: the key is absent (get)
  4  refused: the node answered 4xx (unauthorized, forbidden, too large, over quota after
     the retries, ...); the same request will not succeed unchanged
  5  unavailable: connection refused or cut, timeout, or a 5xx answer

environment: MERCURY_URL, MERCURY_READ_URL, MERCURY_TOKEN_FILE give the defaults of
--url, --read-url and --token-file.
"""

#: Records of an import file per batch request (and per checkpoint). A request of as many
#: ops as the root's batch limit (10,000 by default) commits at once instead of waiting for
#: the batch window, so large requests import fastest (see docs/client.md).
IMPORT_BATCH = 10_000


def _common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument(
        "--url",
        default=os.environ.get("MERCURY_URL", "http://127.0.0.1:8080"),
        metavar="URL[,URL...]",
        help="the root's gateway URL, for writes, or every HA candidate's, comma-separated "
        "(the leader is found and followed; default $MERCURY_URL or http://127.0.0.1:8080)",
    )
    g.add_argument(
        "--read-url",
        default=os.environ.get("MERCURY_READ_URL"),
        help="a replica or consumer node, for ls/export/watch/get (default $MERCURY_READ_URL, "
        "else --url)",
    )
    g.add_argument(
        "--token-file",
        default=os.environ.get("MERCURY_TOKEN_FILE"),
        help="file holding the producer's bearer token (default $MERCURY_TOKEN_FILE)",
    )
    g.add_argument("--ca", help="CA bundle (PEM) that verifies the node's TLS certificate")
    g.add_argument("--cert", help="client certificate (PEM) for mutual TLS")
    g.add_argument("--key", dest="cert_key", help="private key (PEM) of --cert")
    g.add_argument("--timeout", type=float, default=30.0, help="seconds per network wait")
    g.add_argument(
        "--retries",
        type=int,
        default=None,
        help="tries per request in all (default: 6, and on while the waits are under "
        f"{DEFAULT_BUDGET_S:.0f} s: one HA failover)",
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

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = ks.add_parser(
            name,
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
    p.set_defaults(func=_run(_put))

    p = add("get", "print KEY's value (raw bytes, no newline added); exit 3 when absent")
    p.add_argument("key", metavar="KEY")
    p.set_defaults(func=_run(_get))

    p = add("del", "delete KEY")
    p.add_argument("key", metavar="KEY")
    p.add_argument("--if-seq", type=int, help="only if KEY's current seq is this one (else exit 4)")
    p.set_defaults(func=_run(_del))

    p = add("ls", "list the keys under PREFIX (one a line), or JSON lines with --values")
    p.add_argument("prefix", metavar="PREFIX")
    p.add_argument("--values", action="store_true", help="JSON lines {key, value} instead")
    p.set_defaults(func=_run(_ls))

    p = add(
        "import",
        "write the JSON lines of FILE ({key|key_b64, value|value_b64}, or "
        '{"op": "delete", key}) in batches; resumable: a checkpoint file records the lines '
        "acknowledged, and each batch's Idempotency-Key derives from the file's SHA-256 and "
        "its line numbers, so a rerun skips what was done and never writes a batch twice",
    )
    p.add_argument("file", metavar="FILE", type=Path)
    p.add_argument(
        "--batch-size",
        type=int,
        default=IMPORT_BATCH,
        help=f"records per request and checkpoint (default {IMPORT_BATCH:,})",
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
        help="progress bar on stderr (default: when stderr is a terminal)",
    )
    p.set_defaults(func=_run(_import))

    p = add(
        "export",
        "print every key under PREFIX as JSON lines (the form import reads), as it was at "
        "one log seq of the read node (printed on stderr)",
    )
    p.add_argument("prefix", metavar="PREFIX")
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


def _run(cmd: Any) -> Any:
    def run(args: argparse.Namespace) -> int:
        try:
            with _client(args) as client:
                return int(cmd(client, args))
        except UsageError as err:
            print(f"mercury kv: {err}", file=sys.stderr)
            return USAGE
        except MercuryClientError as err:
            print(f"mercury kv: {err}", file=sys.stderr)
            return exit_status(err)
        except BrokenPipeError:  # e.g. `mercury kv ls P | head`
            sys.stderr.close()
            return OK
        except OSError as err:  # a local file: the import file, its checkpoint
            print(f"mercury kv: {err}", file=sys.stderr)
            return USAGE

    return run


def _client(args: argparse.Namespace) -> Client:
    token = None
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as err:
            raise UsageError(f"cannot read --token-file: {err}") from err
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


# --- commands --------------------------------------------------------------------------------


def _put(client: Client, args: argparse.Namespace) -> int:
    value = sys.stdin.buffer.read() if args.value == "-" else args.value.encode()
    r = client.put(args.key, value, if_seq=args.if_seq, if_absent=args.if_absent)
    _json_line({"seq": r.seq, "status": r.status})
    return OK


def _get(client: Client, args: argparse.Namespace) -> int:
    v = client.get(args.key)
    if v is None:
        print(f"mercury kv: no key {args.key!r}", file=sys.stderr)
        return NOT_FOUND
    _out().write(v)
    _out().flush()
    return OK


def _del(client: Client, args: argparse.Namespace) -> int:
    r = client.delete(args.key, if_seq=args.if_seq)
    _json_line({"seq": r.seq, "status": r.status})
    return OK


def _ls(client: Client, args: argparse.Namespace) -> int:
    _print_items(client.range(args.prefix, keys_only=not args.values), args.values)
    return OK


def _print_items(items: Iterator[wire.Item], values: bool) -> int:
    n = 0
    for it in items:
        if values:
            doc: dict[str, Any] = {}
            _put_bytes(doc, "key", it.key)
            _put_bytes(doc, "value", it.value or b"")
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
    n = _print_items(snap.items, True)
    print(f"exported {n} keys at seq {snap.seq}", file=sys.stderr)
    return OK


def _watch(client: Client, args: argparse.Namespace) -> int:
    try:
        for c in client.watch(args.prefix, from_seq=args.from_seq):
            doc: dict[str, Any] = {"seq": c.seq, "op": c.op}
            _put_bytes(doc, "key", c.key)
            if c.value is not None:
                _put_bytes(doc, "value", c.value)
            _json_line(doc)
    except Gone as err:
        print(f"mercury kv: {err}", file=sys.stderr)
        print(
            "hint: `mercury kv export PREFIX` prints the keys at one seq S (on stderr); "
            "then `mercury kv watch PREFIX --from-seq S+1`",
            file=sys.stderr,
        )
        return REFUSED
    return OK


# --- import ----------------------------------------------------------------------------------


def parse_line(line: bytes, lineno: int) -> tuple[str, bytes, bytes | None]:
    """One import line as (op, key, value); UsageError naming the line when malformed."""
    try:
        doc = json.loads(line)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        op = doc.get("op", "set")
        if op not in ("set", "delete"):
            raise ValueError(f"op must be set or delete, got {op!r}")
        key = _field(doc, "key")
        if key is None:
            raise ValueError("no key or key_b64")
        value = _field(doc, "value")
        if op == "set" and value is None:
            raise ValueError("no value or value_b64")
    except (ValueError, TypeError) as err:
        raise UsageError(f"line {lineno}: {err}") from err
    return op, key, value if op == "set" else None


def _field(doc: dict[str, Any], name: str) -> bytes | None:
    if isinstance(doc.get(name), str):
        return str(doc[name]).encode()
    if isinstance(doc.get(name + "_b64"), str):
        return base64.b64decode(doc[name + "_b64"], validate=True)
    return None


def _records(path: Path, skip: int) -> Iterator[tuple[int, tuple[str, bytes, bytes | None]]]:
    """(line number, op) of the file's non-blank lines after the first `skip` records."""
    n = 0
    with path.open("rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            n += 1
            if n > skip:
                yield lineno, parse_line(line, lineno)


def _scan(path: Path) -> tuple[str, int]:
    """The file's SHA-256 and its number of records; every line checked before any write."""
    h = hashlib.sha256()
    n = 0
    try:
        with path.open("rb") as f:
            for lineno, line in enumerate(f, 1):
                h.update(line)
                if line.strip():
                    parse_line(line, lineno)
                    n += 1
    except OSError as err:
        raise UsageError(f"cannot read {path}: {err}") from err
    return h.hexdigest(), n


def _import(client: Client, args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    digest, total = _scan(args.file)
    ckpt: Path = args.checkpoint or args.file.with_name(args.file.name + ".mercury-import")
    done = 0
    if ckpt.exists():
        try:
            state = json.loads(ckpt.read_text())
        except (OSError, ValueError) as err:
            raise UsageError(f"unreadable checkpoint {ckpt}: {err}") from err
        if state.get("sha256") == digest and state.get("batch_size") == args.batch_size:
            done = int(state.get("records_done", 0))
    resumed_at = done
    summary = {"records": total, "resumed_at": resumed_at, "requests": 0, "replayed": 0}
    counts = {"written": 0, "deleted": 0, "duplicates": 0, "absent": 0}
    bar = tqdm(
        total=total,
        initial=done,
        unit="key",
        disable=(not args.progress) if args.progress is not None else None,
        file=sys.stderr,
    )
    try:
        chunk: list[tuple[str, bytes, bytes | None]] = []
        for _lineno, op in _records(args.file, done):
            chunk.append(op)
            if len(chunk) == args.batch_size:
                done = _import_chunk(client, chunk, digest, done, summary, counts, ckpt, args)
                bar.update(len(chunk))
                chunk = []
        if chunk:
            done = _import_chunk(client, chunk, digest, done, summary, counts, ckpt, args)
            bar.update(len(chunk))
    finally:
        bar.close()
    ckpt.unlink(missing_ok=True)
    _json_line({**summary, **counts})
    return OK


def _import_chunk(
    client: Client,
    chunk: list[tuple[str, bytes, bytes | None]],
    digest: str,
    done: int,
    summary: dict[str, int],
    counts: dict[str, int],
    ckpt: Path,
    args: argparse.Namespace,
) -> int:
    """Send records ``done+1 .. done+len(chunk)`` under a key that names them, then record
    the progress (a crash in between replays the batch's first answer on the rerun)."""
    idem = f"import:{digest[:32]}:{done + 1}-{done + len(chunk)}"
    r = client.batch(chunk, idempotency_key=idem)
    summary["requests"] += r.requests
    summary["replayed"] += r.replayed
    for k in counts:
        counts[k] += getattr(r, k)
    done += len(chunk)
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    tmp.write_text(
        json.dumps({"sha256": digest, "batch_size": args.batch_size, "records_done": done})
    )
    os.replace(tmp, ckpt)
    return done
