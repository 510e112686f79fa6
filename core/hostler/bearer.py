"""What can be the daemon's bearer token (read by the daemon's settings and by the CLI)."""

from __future__ import annotations

__all__ = ["valid_token"]


def valid_token(text: str) -> bool:
    """Whether ``text`` can be a bearer token: 32 to 256 printable ASCII characters, no space."""
    return 32 <= len(text) <= 256 and text.isascii() and text.isprintable() and " " not in text
