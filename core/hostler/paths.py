"""Where hostler keeps its files by default (driver layer: reads the environment)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["default_data_dir", "default_log_path", "private_dir", "private_file"]

EVENTS_FILE = "events.db"


def default_data_dir() -> Path:
    """``$HOSTLER_HOME``, else ``$XDG_DATA_HOME/hostler``, else ``~/.local/share/hostler``."""
    home = os.environ.get("HOSTLER_HOME")
    if home:
        return Path(home).expanduser().absolute()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return (base / "hostler").absolute()


def default_log_path(data_dir: Path | None = None) -> Path:
    """The event log file inside a data directory."""
    return (data_dir or default_data_dir()) / EVENTS_FILE


def private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) for this user only (0700); tighten one we own.

    Engine logs, work directories and launch tokens are nobody else's business.
    """
    missing = [path, *(parent for parent in path.parents if not parent.exists())]
    for folder in reversed([p for p in missing if not p.exists()]):
        folder.mkdir(exist_ok=True, mode=0o700)  # every folder it creates, not just the last
    info = path.stat()
    if info.st_uid == os.geteuid() and info.st_mode & 0o077:
        path.chmod(0o700)
    return path


def private_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file only this user can read (0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
