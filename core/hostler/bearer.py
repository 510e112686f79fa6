"""What can be the daemon's bearer token (read by the daemon's settings and by the CLI)."""

from __future__ import annotations

import hashlib

__all__ = ["token_id", "valid_token"]


def token_id(token: str) -> str:
    """A token's public name: 16 hex digits of its SHA-256.

    ``GET /health`` says it, so that a client can tell, before it sends a data directory's
    token, that the daemon already holds it (a stale address file may name another daemon's
    port).
    """
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def valid_token(text: str) -> bool:
    """Whether ``text`` can be a bearer token: 32 to 256 printable ASCII characters, no space."""
    return 32 <= len(text) <= 256 and text.isascii() and text.isprintable() and " " not in text
