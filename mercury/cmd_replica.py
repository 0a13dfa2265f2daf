"""Commands of the replica side (registered by `mercury.cli`)."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    """Add this module's subcommands to the `mercury` parser."""
    _ = (sub, argparse)
