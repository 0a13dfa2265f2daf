"""Store commands: init, status, verify, migrate, snapshot, restore, promote, prune-aside
(docs/api.md lists every command)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any

from tqdm import tqdm

from acl.tokens import hash_token, new_token
from core.cpuflags import cpu_flags
from core.errors import ConfigError, MercuryError, StoreNotFoundError
from mercury.cliopts import json_output, output_args
from migrations import runner
from store import chainhash, setaside
from store import check as store_check
from store.docs import ADMIN_HASH
from store.lock import WriterLock
from store.promotion import promote
from store.restore import Restored, restore
from store.snapshot import make_snapshot
from store.store import Store

ADMIN_TOKEN_FILE = "admin.token"


def register(sub: Any) -> None:
    """Add the store commands to the `mercury` parser."""
    p = sub.add_parser(
        "init",
        help="create an empty root store and its admin token",
        description="Create an empty root store in DATA_DIR, write a new admin token to "
        "DATA_DIR/admin.token (mode 0600; only its hash is stored) and print the db id. "
        "Refuses a DATA_DIR that already holds a store.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument(
        "--chain-hash",
        choices=sorted(chainhash.BY_NAME),
        default=None,
        help="hash of the log's chain, fixed for this store and every replica and snapshot "
        "made from it; every node hashes every byte written. Default: sha256 when this "
        "CPU has SHA extensions (about 0.6x BLAKE2b's cost there), else blake2b-256 "
        "(SHA-256 costs 1.5-1.9x BLAKE2b without them). Name it when the fleet's CPUs "
        "differ from this one's",
    )
    p.set_defaults(func=cmd_init)

    p = sub.add_parser(
        "status",
        help="print db id, format version, seq, hash head, first retained log seq",
        description="Print the store's identity and position: db_id, format_version, seq "
        "(last committed/applied), hash_head and log_first_seq.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    output_args(p, "one JSON object")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "verify",
        help="check every CRC and the whole retained hash chain",
        description="Check every value's CRC, the retained log's continuity and hash chain, "
        "the format version and the usage counters. Exit 0 when clean, 1 with a report.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser(
        "migrate",
        help="apply pending on-disk format migrations",
        description="Apply pending format migrations, each in one transaction (crash-safe: "
        "rerun after an interruption). --dry-run only lists them.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("--dry-run", action="store_true", help="list pending steps, change nothing")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "snapshot",
        help="write a compact, verifiable copy of the store to a file",
        description="Write a compact copy of the store to OUT (taken in one short read "
        "transaction) and OUT.json describing it (db_id, seq, hash_head, sha256, size).",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument("out", metavar="OUT")
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser(
        "restore",
        help="install a snapshot as a stopped node's store",
        description="Check SNAPSHOT (written by `mercury snapshot`) against SNAPSHOT.json "
        "(size, SHA-256, format, db id, seq, hash head) and install it atomically as the "
        "store of DATA_DIR; the store it replaces is kept in DATA_DIR/.replaced-<ms>/. A "
        "root's restore logs a 'restore' document right after the snapshot's seq, so "
        "replicas that applied more than the snapshot holds stop as diverged as soon as "
        "they reconnect. Prints what was done and what the replicas will do. Refuses while "
        "a process holds DATA_DIR (exit 2), and a snapshot that fails a check (exit 2, "
        "DATA_DIR unchanged).",
    )
    p.add_argument("snapshot", metavar="SNAPSHOT")
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument(
        "--replica",
        action="store_true",
        help="seed a replica's store instead of restoring a root's: log nothing, drop the "
        "source node's node-local documents",
    )
    output_args(p, "one JSON object only")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing when done (errors still print)"
    )
    p.set_defaults(func=cmd_restore)

    p = sub.add_parser(
        "prune-aside",
        help="remove store copies set aside in DATA_DIR",
        description="Remove the store copies set aside in DATA_DIR (.diverged-<ms>/ of an "
        "HA standby, .replaced-<ms>/ of `mercury restore`; GET /v1/status lists them) set "
        "aside at least --older-than seconds ago, and print each one removed.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.add_argument(
        "--older-than",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep copies set aside less than SECONDS ago (default 0: remove all)",
    )
    p.set_defaults(func=cmd_prune_aside)

    p = sub.add_parser(
        "promote",
        help="turn a stopped replica's store into a root's",
        description="Make the store in DATA_DIR (a replica's, whose process is stopped) a "
        "root's: log a 'promotion' document after its last seq (seq and hash chain go on), "
        "remove the replica's status file and any unfinished bootstrap download, and print "
        "what was recorded as JSON. Then `mercury root DATA_DIR` serves writes with every "
        "producer, token, quota and the admin token of the old root. Refuses while another "
        "process holds the store. Promote the replica with the highest seq.",
    )
    p.add_argument("data_dir", metavar="DATA_DIR")
    p.set_defaults(func=cmd_promote)


def cmd_init(args: argparse.Namespace) -> int:
    """`mercury init DATA_DIR`."""
    with WriterLock.acquire(args.data_dir):
        return _init(args)


def _init(args: argparse.Namespace) -> int:
    store = Store.create(args.data_dir, chain_hash=args.chain_hash or chainhash.pick(cpu_flags()))
    try:
        token = new_token()
        path = os.path.join(args.data_dir, ADMIN_TOKEN_FILE)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        # Through the log (a record of its own): every replica holds it (docs/security.md).
        store.put_docs({ADMIN_HASH: hash_token(token).encode()})
        print(store.db_id)
        print(f"admin token written to {path}", file=sys.stderr)
    finally:
        store.close()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """`mercury status DATA_DIR [--json]`."""
    store = Store.open(args.data_dir, readonly=True, check_format=False)
    try:
        st = store.status()
    finally:
        store.close()
    if json_output(args):
        print(json.dumps(st))
    else:
        for k, v in st.items():
            print(f"{k:15} {v}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """`mercury verify DATA_DIR`: exit 0 clean, 1 with a report (a file too damaged to
    open is a report too, never a traceback)."""
    try:
        store = Store.open(args.data_dir, readonly=True)
    except MercuryError:
        raise  # not a store, pending migrations...: the CLI's message and exit status 2
    except Exception as err:  # LMDB refusing a damaged file
        print(f"1 problem(s):\n  - store cannot be opened: {type(err).__name__}: {err}")
        return 1
    try:
        total = store_check.work_units(store)
        with tqdm(total=total, unit="rec", desc="verify", disable=None, file=sys.stderr) as bar:
            report = store_check.check(store, bar.update)
    finally:
        store.close()
    print(
        f"checked {report.values} values, {report.log_records} log records "
        f"({report.log_entries} entries)"
    )
    if report.ok:
        print("clean")
        return 0
    print(f"{report.problem_count} problem(s):")
    for p in report.problems:
        print(f"  - {p}")
    if report.problem_count > len(report.problems):
        print(f"  ... and {report.problem_count - len(report.problems)} more")
    return 1


def cmd_migrate(args: argparse.Namespace) -> int:
    """`mercury migrate DATA_DIR [--dry-run]`."""
    if args.dry_run:
        return _migrate(args)
    with WriterLock.acquire(args.data_dir, create=False):  # never beside a root or worker
        return _migrate(args)


def _migrate(args: argparse.Namespace) -> int:
    steps = runner.pending(args.data_dir)
    if not steps:
        print("store is at the current format; nothing to do")
        return 0
    for s in steps:
        print(
            f"{'pending' if args.dry_run else 'apply'}: {s.name} "
            f"(format {s.from_version} -> {s.to_version}): {s.description}"
        )
    if args.dry_run:
        return 0
    total = runner.work_units(args.data_dir)
    with tqdm(total=total, unit="rec", desc="migrate", disable=None, file=sys.stderr) as bar:
        runner.migrate(args.data_dir, progress=bar.update)
    print(f"migrated to format {steps[-1].to_version}")
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """`mercury snapshot DATA_DIR OUT`."""
    where = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(where):  # named before the store is read, as OUT (not OUT.partial)
        raise ConfigError(f"cannot write the snapshot {args.out}: no directory {where}")
    store = Store.open(args.data_dir, readonly=True)
    try:
        with tqdm(unit="B", unit_scale=True, desc="snapshot", disable=None, file=sys.stderr) as bar:
            info = make_snapshot(store, args.out, bar.update, node_local=True)
    finally:
        store.close()
    print(info.to_json())
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    """`mercury restore SNAPSHOT DATA_DIR [--replica] [--json]`: exit 0 with what was done,
    2 when DATA_DIR is held by a running process or the snapshot fails a check."""
    created = _first_missing(args.data_dir)
    try:
        with WriterLock.acquire(args.data_dir):
            done = restore(args.snapshot, args.data_dir, replica=args.replica)
    except BaseException:
        # A refused restore leaves nothing behind: not the directory the lock created
        # (an empty DATA_DIR would later read as "no store" rather than "never restored").
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        raise
    if json_output(args):
        print(done.to_json())
        return 0
    if args.quiet:
        return 0
    for line in restore_report(done, args.replica, args.data_dir):
        print(line)
    return 0


def _first_missing(path: str) -> str | None:
    """The outermost directory of `path` that does not exist yet (None when it exists)."""
    path = os.path.abspath(path)
    if os.path.exists(path):
        return None
    while not os.path.exists(os.path.dirname(path)):
        path = os.path.dirname(path)
    return path


def restore_report(done: Restored, replica: bool, data_dir: str) -> list[str]:
    """What `mercury restore` says it did and what happens next (the set-aside copy by its
    path, so that it is not looked for in the working directory)."""
    out = [f"restored db {done.db_id} at seq {done.seq} (hash head {done.hash_head})"]
    if done.set_aside is not None:
        was = f"seq {done.replaced_seq}" if done.replaced_seq is not None else "unreadable"
        out.append(
            f"the replaced store ({was}) is kept in {os.path.join(data_dir, done.set_aside)}/"
        )
    if replica:
        out.append(
            f"next: start `mercury replica` on this DATA_DIR: it streams from seq "
            f"{done.seq + 1} if its source still retains that seq, else it bootstraps"
        )
        return out
    out.append(f"logged the 'restore' document at seq {done.restore_seq}")
    if done.replaced_db_id is not None and done.replaced_db_id != done.db_id:
        out.append(
            f"warning: the replaced store was db {done.replaced_db_id}: its replicas refuse "
            "this root (db id mismatch) until re-bootstrapped"
        )
    out += [
        "next: start `mercury root` on this DATA_DIR; then its replicas:",
        f"  - from seq {max(0, done.log_first_seq - 1)} to {done.seq} continue streaming "
        "(below that the log no longer holds their next seq: they bootstrap)",
        f"  - above seq {done.seq} hold writes this root no longer has: each stops as "
        "diverged within seconds of reconnecting (/v1/status replication_state "
        "'diverged', mercury_replication_diverged 1); re-bootstrap it: stop it, move its "
        "DATA_DIR away, start it again",
    ]
    return out


def cmd_prune_aside(args: argparse.Namespace) -> int:
    """`mercury prune-aside DATA_DIR [--older-than SECONDS]`: exit 2 when DATA_DIR is
    not a directory (a mistyped path must not read as "nothing to prune")."""
    if not os.path.isdir(args.data_dir):
        raise StoreNotFoundError(f"no data directory {args.data_dir!r}")
    for s in setaside.prune(args.data_dir, args.older_than):
        print(f"removed {s.name} ({s.bytes} bytes)")
    return 0


#: What a replica's worker leaves in its data directory beside the store
#: (`replicator/status.py`, `replicator/bootstrap.py`); a root has neither.
REPLICA_FILES = ("replication.json", ".bootstrap")


def cmd_promote(args: argparse.Namespace) -> int:
    """`mercury promote DATA_DIR`: exit 0 with the promotion as JSON, 2 when the store is
    locked by a running process, missing or at an older format."""
    with WriterLock.acquire(args.data_dir, create=False):
        store = Store.open(args.data_dir)
        try:
            done = promote(store)
        finally:
            store.close()
        for name in REPLICA_FILES:
            path = os.path.join(args.data_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    print(done.to_json())
    if not done.has_admin:
        print(
            "warning: the store holds no admin token hash (its root never ran format 5); "
            "admin calls will fail",
            file=sys.stderr,
        )
    if not done.has_acl:
        print("warning: the store holds no ACL: no producer can write yet", file=sys.stderr)
    return 0
