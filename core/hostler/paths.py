"""Where hostler keeps its files by default (driver layer: reads the environment)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_data_dir", "default_log_path"]

EVENTS_FILE = "events.db"


def default_data_dir() -> Path:
    """``$HOSTLER_HOME``, else ``$XDG_DATA_HOME/hostler``, else ``~/.local/share/hostler``."""
    home = os.environ.get("HOSTLER_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "hostler"


def default_log_path(data_dir: Path | None = None) -> Path:
    """The event log file inside a data directory."""
    return (data_dir or default_data_dir()) / EVENTS_FILE
