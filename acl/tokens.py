"""Bearer tokens: generated at random, stored only as hashes (`acl.principals` resolves
them).

A token is ``mct_`` + 43 URL-safe characters (256 random bits). Its stored form is the hex
SHA-256 of the whole token: with 256 bits of entropy a slow KDF adds nothing, and a fast hash
keeps per-request auth cheap.
"""

from __future__ import annotations

import hashlib
import secrets

PREFIX = "mct_"


def new_token() -> str:
    """A fresh random token (shown once to its owner, never stored)."""
    return PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """The stored form of `token`."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
