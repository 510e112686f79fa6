"""An exclusive lock file: one daemon owns one event log at a time."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from hostler.errors import StoreLockedError, StorePathError

__all__ = ["OwnerLock"]


class OwnerLock:
    """A held ``flock`` on ``path``; the holder's pid is written into the file.

    The kernel drops the lock when the holder dies, so a crashed daemon never leaves a stale
    lock behind. Two stores in one process that ask for the same lock also conflict, because
    each opens its own file description.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StorePathError(f"{path}: cannot create lock file ({exc.strerror})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            who = f" (pid {holder})" if holder else ""
            raise StoreLockedError(
                f"{path}: the event log is owned by another hostler daemon{who}; "
                "stop it or use another data directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return os.read(fd, 32).decode(errors="replace").strip()
    except OSError:
        return ""
