"""Typed settings of each process, built once from its command line.

The components take frozen dataclasses at their seams (`gateway.settings.Settings`,
`replicator.wiring.SourceSettings`, `mercury.listeners.ListenerSettings`,
`store.retention.RetentionPolicy`, `replicator.worker.WorkerConfig`); this module is the
only place that reads `argparse.Namespace` attributes to build them, and it parses every
address once, so a bad flag fails before anything starts.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import asdict, dataclass

from core.addr import UNIX_MODE, UnixAddr, parse_hostport, parse_listen, parse_mode
from core.errors import ConfigError
from gateway.settings import Settings
from mercury.listeners import ListenerSettings
from mercury.retention_flags import policy_from_args
from mercury.tls import files_from_args
from net.tcp import listener_limits
from net.tlsconf import TlsFiles
from replicator import filter as keyspace
from replicator import sched
from replicator.heap import HEAP_KEEP_MB
from replicator.wiring import SourceSettings
from replicator.worker import WorkerConfig
from store.retention import RetentionPolicy


def _addr(value: str | None, flag: str) -> tuple[str, int] | None:
    return parse_hostport(value, flag) if value else None


def unix_mode(args: argparse.Namespace) -> int:
    """`--unix-mode`: the file mode of every unix socket listener of the process."""
    raw = getattr(args, "unix_mode", None)
    return UNIX_MODE if raw is None else parse_mode(raw)


def _listen(value: str | None, flag: str, mode: int) -> tuple[str, int] | UnixAddr | None:
    return parse_listen(value, flag, mode) if value else None


def listener_settings(args: argparse.Namespace, *, memcached: bool) -> ListenerSettings:
    """`--kt-listen` (and, on replicas, `--memcached-listen`: H:P or unix:/path)."""
    mode = unix_mode(args)
    return ListenerSettings(
        kt=_addr(args.kt_listen, "--kt-listen"),
        memcached=_listen(args.memcached_listen, "--memcached-listen", mode) if memcached else None,
        memcached_flags=bool(args.memcached_flags) if memcached else False,
        kt_db_aliases=tuple(a.encode() for a in args.kt_db_alias),
        limits=listener_limits(args),
    )


@dataclass(frozen=True, slots=True)
class RootConfig:
    """Everything `mercury root` runs with."""

    data_dir: str
    listen: tuple[str, int]
    gateway: Settings
    source: SourceSettings
    listeners: ListenerSettings
    retention: RetentionPolicy
    switch_interval_s: float
    sync: bool
    log_level: str
    #: `--kt-producer`: the producer KT writes on the KT listener are made as.
    kt_producer: str | None = None
    #: `--memcached-producer`: the producer memcached writes are made as.
    memcached_producer: str | None = None
    #: `--tls-*`: HTTPS and mutual-TLS replication (None: plaintext).
    tls: TlsFiles | None = None
    #: `--allow-unauthenticated-reads`: KT may listen beyond loopback.
    allow_unauthenticated_reads: bool = False
    #: `--read-auth`: HTTP reads take consumer tokens too, each sees only its keyspaces.
    read_auth: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RootConfig:
        """The root's settings from `mercury root`'s arguments."""
        return cls(
            data_dir=args.data_dir,
            listen=parse_hostport(args.listen, "--listen"),
            gateway=Settings(
                batch_window_ms=float(args.batch_window_ms),
                batch_max_ops=int(args.batch_max_ops),
                batch_max_bytes=int(args.batch_max_bytes),
                consumer_nodes=tuple(args.consumer_node or ()),
                fast_path=not args.no_fast_path,
            ),
            source=SourceSettings(
                listen=_addr(args.repl_listen, "--repl-listen"),
                heartbeat_ms=int(args.heartbeat_ms),
                max_bootstraps=int(args.max_bootstraps),
            ),
            listeners=listener_settings(args, memcached=True),
            retention=policy_from_args(args),
            switch_interval_s=float(args.switch_interval_ms) / 1000.0,
            sync=not args.no_sync,
            log_level=args.log_level,
            kt_producer=args.kt_producer,
            memcached_producer=args.memcached_producer,
            tls=files_from_args(args),
            allow_unauthenticated_reads=bool(args.allow_unauthenticated_reads),
            read_auth=bool(args.read_auth),
        )


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    """Everything `mercury replica` runs with: its read side and its worker's config."""

    #: `--listen`: H:P, or a unix socket for local consumers.
    listen: tuple[str, int] | UnixAddr
    listeners: ListenerSettings
    worker: WorkerConfig
    log_level: str
    #: `--tls-*`: HTTPS reads and mutual-TLS replication (None: plaintext).
    tls: TlsFiles | None = None
    #: `--read-auth`: HTTP reads need a token and see only its keyspaces.
    read_auth: bool = False
    #: `--allow-unauthenticated-reads`: KT and memcached may listen beyond loopback.
    allow_unauthenticated_reads: bool = False
    #: With `--applier-cpus`: the CPUs the read server keeps (the worker has the others).
    reader_cpus: frozenset[int] | None = None

    @property
    def data_dir(self) -> str:
        """The replica's store directory (absolute)."""
        return self.worker.data_dir

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ReplicaConfig:
        """The replica's settings from `mercury replica`'s arguments."""
        tls = files_from_args(args)
        applier_cpus, reader_cpus = _cpus(getattr(args, "applier_cpus", None))
        return cls(
            listen=parse_listen(args.listen, "--listen", unix_mode(args)),
            listeners=listener_settings(args, memcached=True),
            worker=WorkerConfig(
                data_dir=os.path.abspath(args.data_dir),
                sources=[parse_hostport(s, "--source") for s in args.source],
                repl_listen=_addr(args.repl_listen, "--repl-listen"),
                staleness=float(args.staleness_s),
                failback=float(args.failback_s),
                apply_window=_apply_window(args.apply_window_ms),
                max_bootstraps=int(args.max_bootstraps),
                sync=not args.no_sync,
                retention=asdict(policy_from_args(args)),
                nice=int(args.applier_nice),
                heap_keep_mb=_heap_keep_mb(args.applier_heap_keep_mb),
                tls=asdict(tls) if tls is not None else None,
                cpus=sorted(applier_cpus) if applier_cpus else None,
                keyspaces=_keyspaces(getattr(args, "keyspace", None)),
            ),
            log_level=args.log_level,
            tls=tls,
            read_auth=bool(args.read_auth),
            allow_unauthenticated_reads=bool(args.allow_unauthenticated_reads),
            reader_cpus=reader_cpus,
        )


def _keyspaces(values: list[str] | None) -> list[str] | None:
    """`--keyspace`: a filtered replica's prefixes, normalized (`replicator/filter.py`);
    None without the flag."""
    if not values:
        return None
    try:
        return [p.decode() for p in keyspace.normalize(v.encode() for v in values)]
    except ValueError as err:
        raise ConfigError(f"--keyspace: {err}") from err


def _cpus(value: str | None) -> tuple[frozenset[int] | None, frozenset[int] | None]:
    """`--applier-cpus`: (the worker's CPUs, the read server's), checked against the CPUs
    this process may use; (None, None) without the flag."""
    if not value:
        return None, None
    try:
        applier = sched.parse_cpus(value)
        return applier, sched.split_cpus(frozenset(os.sched_getaffinity(0)), applier)
    except ValueError as err:
        raise ConfigError(
            f"--applier-cpus: {err}", hint="e.g. --applier-cpus 3 on a machine with CPUs 0-3"
        ) from None


def _heap_keep_mb(mb: int) -> int:
    """`--applier-heap-keep-mb`: 0 to 1,024 MB (glibc takes at most half its int range)."""
    if not 0 <= mb <= 1024:
        raise ConfigError(
            f"--applier-heap-keep-mb must be 0 to 1024, got {mb}",
            hint=f"the default {HEAP_KEEP_MB} keeps a busy stream's working memory; 0 "
            "hands freed memory back as the C library decides",
        )
    return mb


def _apply_window(ms: float) -> float:
    """`--apply-window-ms` in seconds: 0 to 1,000 ms (longer only delays reads)."""
    if not 0 <= ms <= 1000:
        raise ConfigError(
            f"--apply-window-ms must be 0 to 1000, got {ms:g}",
            hint="0 (the default) commits each record as it comes; 20 groups a heavy "
            "stream's records a few at a time",
        )
    return ms / 1000
