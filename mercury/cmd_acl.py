"""`mercury acl ...`: the ACL document, tokens and the audit log, over the admin API.

- `acl apply FILE [--prune] [--dry-run]`: make the root's ACL match FILE with ONE
  ``PUT /v1/admin/acl`` (If-Match the version it read): all of it or nothing. Producers and
  consumers FILE omits are kept unless --prune. --dry-run asks the server for the same
  validation and diff (``?dry_run=true``) and commits nothing.
- `acl token create NAME --label L [--expires 90d] [--consumer]`, `acl token list NAME`,
  `acl token revoke NAME TOKEN_ID`.
- `acl log [--since SEQ|TIME]`: the audit records.
- `acl admin-token rotate [--out FILE]`: a new admin token (``POST /v1/admin/token``),
  written to FILE (default: the --admin-token-file it replaces), mode 0600, atomically.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

import orjson

from core.errors import ConfigError
from mercury import adminclient
from mercury.cliopts import cell, json_output, output_args, render_table, table_output
from mercury_client.wire import segment

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def register(sub: Any) -> None:
    """Add the `acl` command and its actions."""
    acl = sub.add_parser("acl", help="manage producers, consumers, tokens; read the audit log")
    acts = acl.add_subparsers(dest="acl_command", required=True, metavar="ACTION")

    ap = acts.add_parser(
        "apply",
        help="make the ACL match a YAML document, in one all-or-nothing PUT",
        description="Make the root's producers and consumers match FILE with one PUT "
        "/v1/admin/acl: everything or nothing, every problem listed. Prints the diff. "
        "Idempotent: a second run prints `no changes`. Producers and consumers FILE omits "
        "are kept unless --prune. Tokens are never in FILE and are kept.",
    )
    ap.add_argument("file", metavar="FILE", help="YAML document (see docs/security.md)")
    adminclient.client_args(ap)
    ap.add_argument(
        "--dry-run", action="store_true", help="show exactly what the PUT would do, change nothing"
    )
    ap.add_argument(
        "--prune", action="store_true", help="remove producers and consumers FILE omits"
    )
    output_args(ap, 'the root\'s answer {"version", "changes", "committed", "dry_run"}')
    # accepted for old scripts: keeping what FILE omits is the default now
    ap.add_argument("--keep-unlisted", action="store_true", help=argparse.SUPPRESS)
    ap.set_defaults(func=_apply)

    tok = acts.add_parser("token", help="create, list or revoke tokens")
    tacts = tok.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    tc = tacts.add_parser("create", help="issue a token (printed once, never stored)")
    tc.add_argument("name", metavar="NAME", help="producer (or consumer with --consumer)")
    tc.add_argument("--label", default="", help="what the token is for (shown in listings)")
    tc.add_argument("--expires", help="lifetime such as 90d, 12h, 30m, 3600s (default: never)")
    tc.add_argument("--consumer", action="store_true", help="NAME is a consumer")
    output_args(tc, "the JSON answer")
    adminclient.client_args(tc)
    tc.set_defaults(func=_token_create)
    tl = tacts.add_parser("list", help="token ids, labels, created, expires, last used")
    tl.add_argument("name", metavar="NAME")
    tl.add_argument("--consumer", action="store_true", help="NAME is a consumer")
    output_args(tl, "one JSON token record per line", table=True)
    adminclient.client_args(tl)
    tl.set_defaults(func=_token_list)
    tr = tacts.add_parser("revoke", help="revoke a token (refused from the next request on)")
    tr.add_argument("name", metavar="NAME")
    tr.add_argument("token_id", metavar="TOKEN_ID")
    tr.add_argument("--consumer", action="store_true", help="NAME is a consumer")
    adminclient.client_args(tr)
    tr.set_defaults(func=_token_revoke)

    lg = acts.add_parser("log", help="the audit records of admin changes")
    lg.add_argument("--since", help="a seq (records after it) or an RFC 3339 time")
    output_args(lg, "one JSON record per line", table=True)
    adminclient.client_args(lg)
    lg.set_defaults(func=_log)

    adm = acts.add_parser("admin-token", help="rotate the admin token")
    aacts = adm.add_subparsers(dest="admin_command", required=True, metavar="ACTION")
    ar = aacts.add_parser(
        "rotate",
        help="issue a new admin token; the old one is refused from then on",
        description="Issue a new admin token (POST /v1/admin/token). Its hash replaces the "
        "old one's through the log, so every root candidate refuses the old token from the "
        "next request on, after a failover too. The new token is written to --out "
        "(default: the --admin-token-file, replaced atomically), mode 0600, never printed.",
    )
    adminclient.client_args(ar)
    ar.add_argument("--out", help="file to write the new token to (default: --admin-token-file)")
    ar.set_defaults(func=_admin_rotate)


def parse_duration(text: str) -> int:
    """Seconds of a lifetime such as ``90d``, ``12h``, ``30m``, ``3600s`` or ``3600``."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhdw]?)\s*", text)
    if not m or int(m.group(1)) <= 0:
        raise ConfigError(f"--expires {text!r}: expected a positive duration such as 90d or 12h")
    return int(m.group(1)) * _UNITS[m.group(2) or "s"]


def _holder_path(args: argparse.Namespace) -> str:
    kind = "consumers" if args.consumer else "producers"
    return f"/v1/admin/{kind}/{segment(args.name)}"


def _apply(args: argparse.Namespace) -> int:
    from acl import doc

    desired = doc.parse_document(Path(args.file).read_text(), f"ACL document {args.file}")
    with adminclient.client(args) as c:
        r = c.get("/v1/admin/acl")
        current = adminclient.check(r)
        body = doc.merge_kept(current, desired, prune=args.prune)
        params = {"dry_run": "true"} if args.dry_run else {}
        headers = {"If-Match": r.headers["etag"], "Content-Type": "application/json"}
        answer = adminclient.check(c.put("/v1/admin/acl", params=params, content=orjson.dumps(body),
                              headers=headers))  # fmt: skip
    if json_output(args):
        sys.stdout.write(orjson.dumps(answer).decode() + "\n")
        return 0
    if args.quiet:
        return 0
    changes = answer["changes"]
    if not changes:
        print("no changes")
        return 0
    for line in changes:
        print(line)
    if args.dry_run:
        print(f"{len(changes)} change(s) not applied (--dry-run)")
    else:
        print(f"{len(changes)} change(s) applied (ACL version {answer['version']})")
    return 0


def _token_create(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"label": args.label}
    if args.expires:
        body["expires_in_s"] = parse_duration(args.expires)
    with adminclient.client(args) as c:
        got = adminclient.check(c.post(_holder_path(args) + "/tokens", json=body))
    if json_output(args):
        sys.stdout.write(orjson.dumps(got).decode() + "\n")
        return 0
    print(got["token"])
    if args.quiet:
        return 0
    print(
        f"token_id {got['token_id']}  label {got['label']!r}  expires {got['expires'] or 'never'}"
        "  (the token is shown only now)",
        file=sys.stderr,
    )
    return 0


def _token_list(args: argparse.Namespace) -> int:
    with adminclient.client(args) as c:
        tokens = adminclient.check(c.get(_holder_path(args) + "/tokens"))["tokens"]
    if table_output(args):
        cols = ("token_id", "label", "created", "expires", "last_used")
        rows = [[cell(t[k] or ("never" if k == "expires" else "-")) for k in cols] for t in tokens]
        sys.stdout.write(render_table(cols, rows))
        return 0
    for t in tokens:
        if json_output(args):
            sys.stdout.write(orjson.dumps(t).decode() + "\n")
            continue
        print(
            f"{t['token_id']}  label={t['label']!r}  created={t['created']}  "
            f"expires={t['expires'] or 'never'}  last_used={t['last_used'] or '-'}"
        )
    return 0


def _token_revoke(args: argparse.Namespace) -> int:
    with adminclient.client(args) as c:
        adminclient.check(c.delete(_holder_path(args) + "/tokens/" + segment(args.token_id)))
    if not args.quiet:
        print(f"revoked {args.token_id}")
    return 0


def _log(args: argparse.Namespace) -> int:
    params = {"since": args.since} if args.since else {}
    with adminclient.client(args) as c:
        records = adminclient.check(c.get("/v1/admin/audit", params=params))["records"]
    if table_output(args):
        cols = ("seq", "time", "who", "action", "target")
        rows = [
            [*(cell(str(rec[k])) for k in cols), cell("; ".join(rec["diff"]))] for rec in records
        ]
        sys.stdout.write(render_table((*cols, "diff"), rows))
        return 0
    for rec in records:
        if json_output(args):
            sys.stdout.write(orjson.dumps(rec).decode() + "\n")
            continue
        print(f"{rec['seq']}  {rec['time']}  {rec['who']}  {rec['action']} {rec['target']}")
        for line in rec["diff"]:
            print(f"    {line}")
    return 0


def _admin_rotate(args: argparse.Namespace) -> int:
    out = Path(args.out or args.admin_token_file)
    # The file is opened before the call: once the root answers, the old token is refused
    # and the new one exists nowhere else, so a file we cannot write must fail first. It is
    # written beside the target and renamed over it: the old file or the new, never torn.
    tmp = out.with_name(f".{out.name}.new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        try:
            with adminclient.client(args) as c:
                answer = adminclient.check(c.post("/v1/admin/token"))
        except BaseException:
            os.unlink(tmp)
            raise
        f.write(answer["token"] + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out)
    if not args.quiet:
        print(f"admin token rotated at {answer['created']}; the new token is in {out}")
    return 0
