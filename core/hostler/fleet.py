"""A fleet's host names: what one daemon calls its host in a log that several hosts share.

Pure: validation only. Where a host's events live is the store's business
(:mod:`hostler.store.postgres`); what a fleet is and its limits: docs/fleet.md.
"""

from __future__ import annotations

import re

__all__ = ["HOST_NAME_MAX", "host_name_problem"]

#: The longest host name (it becomes part of a PostgreSQL schema name, at most 63 bytes).
HOST_NAME_MAX = 40

_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")


def host_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a host of a fleet, or None when it can.

    Lower-case letters, digits and ``-``, starting with a letter or digit, 1 to 40 characters:
    it is kept in every event's metadata and names the host's part of a shared log.
    """
    if not name or len(name) > HOST_NAME_MAX:
        return f"a host name has 1 to {HOST_NAME_MAX} characters"
    if not _NAME.fullmatch(name):
        return (
            f"{name[:HOST_NAME_MAX]!r} is not a host name: lower-case letters, digits and '-', "
            "starting with a letter or digit"
        )
    return None
