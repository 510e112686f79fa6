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

    def __init__(self, path: Path, *, guard: Path | None = None) -> None:
        self.path = path
        self._guard_fd: int | None = None
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
        if guard is not None:
            self._lock_guard(guard)

    def _lock_guard(self, guard: Path) -> None:
        """Also hold the log file itself, so that deleting the lock file admits nobody.

        (``flock`` locks are apart from SQLite's own POSIX locks on the same file.)
        """
        try:
            fd = os.open(guard, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            self.release()
            raise StorePathError(f"{guard}: cannot open ({exc.strerror})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self.release()
            raise StoreLockedError(
                f"{guard}: the event log is owned by another hostler daemon (its lock file "
                f"{self.path.name} was deleted or replaced); stop that daemon first"
            ) from None
        self._guard_fd = fd

    def confirm(self) -> None:
        """The lock is held (a ``flock`` is never lost while its file descriptor is open)."""

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._guard_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._guard_fd, fcntl.LOCK_UN)
            os.close(self._guard_fd)
            self._guard_fd = None
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
