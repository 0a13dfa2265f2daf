"""The retention service collects old log records in the background, bounded per call."""

from __future__ import annotations

import argparse
import asyncio

from mercury.retention_flags import add_arguments, policy_from_args
from store.ops import SET, Op
from store.retention import RetentionPolicy, RetentionService
from store.store import Store
from testkit.wait import wait_until_async


def test_service_collects_by_count_and_keeps_the_floor(store: Store) -> None:
    for i in range(30):
        store.apply([Op(SET, b"k%d" % i, b"v", "p")])
    svc = RetentionService(
        store, RetentionPolicy(keep_entries=5, keep_seconds=None, min_entries=10)
    )

    async def run() -> None:
        await svc.start()
        try:
            await wait_until_async(lambda: store.log_bounds()[0] >= 21, 30, "the log collected")
        finally:
            await svc.stop()

    asyncio.run(run())
    assert store.log_bounds()[0] == 21  # 10 entries kept: the floor wins over keep_entries=5
    assert svc.dropped == 20


def test_flags_make_the_policy() -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    pol = policy_from_args(p.parse_args(["--log-keep-seconds", "0", "--log-keep-entries", "9"]))
    assert pol.keep_seconds is None and pol.keep_entries == 9 and pol.min_entries == 100_000
    assert policy_from_args(p.parse_args([])).keep_seconds == 7 * 24 * 3600
