"""An engine's log file: followed line by line, its tail kept for crash reports, size-capped.

The engine writes ``engine.log`` itself, through the descriptor it inherited at spawn, and
outlives the daemon; hostler caps the file by copy-then-truncate (:func:`rotate_log`), and the
follower notices the truncation and carries on from the start of the file.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

__all__ = [
    "DEFAULT_LOG_KEEP",
    "DEFAULT_LOG_MAX_BYTES",
    "TAIL_BYTES",
    "LogFollower",
    "rotate_log",
    "rotated_path",
]

TAIL_BYTES = 64 * 1024
#: An engine's log is rotated once it is over this many bytes ...
DEFAULT_LOG_MAX_BYTES = 8 * 1024 * 1024
#: ... and this many rotated copies are kept (``engine.log.1`` newest).
DEFAULT_LOG_KEEP = 5


def rotated_path(path: Path, n: int) -> Path:
    """The ``n``-th rotated copy of ``path`` (``engine.log.1`` is the newest)."""
    return path.with_name(f"{path.name}.{n}")


def rotate_log(path: Path, *, max_bytes: int, keep: int) -> bool:
    """Rotate ``path`` once it is over ``max_bytes``: copy it to ``path.1``, then truncate it.

    Older copies move up one (``path.1`` → ``path.2`` …); the one past ``keep`` is deleted, so
    at most ``keep`` copies of about ``max_bytes`` each stay beside the live file. ``keep`` 0
    truncates without keeping a copy. Copies are created 0600, like the log.

    Why copy-then-truncate, not rename or a pipe: the engine writes the file itself, through
    the descriptor it inherited at spawn, and must outlive the daemon (a restarted daemon
    adopts it with its warm cache). Renaming the file would leave the engine writing into the
    renamed copy for ever; piping its output through hostler would tie its life to the
    daemon's (a write to a pipe nobody reads blocks, or kills it with SIGPIPE once the daemon
    is gone). Truncating keeps the engine's descriptor valid, and since the log is opened
    ``O_APPEND`` the engine's next write lands at the new end, not at its old offset. The
    price: output written between the end of the copy and the truncation (microseconds; the
    copy is re-read to its end just before) is lost.

    File I/O: call it off the event loop. Returns whether it rotated.
    """
    try:
        info = os.lstat(path)  # a symlink or FIFO planted in its place is not ours to cut
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_size <= max_bytes:
        return False
    if keep <= 0:
        _truncate(path)
        return True
    rotated_path(path, keep).unlink(missing_ok=True)
    for n in range(keep - 1, 0, -1):
        older = rotated_path(path, n)
        if older.exists():
            older.replace(rotated_path(path, n + 1))
    first = rotated_path(path, 1)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW
    out = os.open(first, flags, 0o600)
    os.fchmod(out, 0o600)  # whatever the umask, and if the name existed with another mode
    source_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    with os.fdopen(source_fd, "rb") as source, os.fdopen(out, "wb") as copy:
        shutil.copyfileobj(source, copy)
        copy.write(source.read())  # what landed while it copied
        copy.flush()
        _truncate(path)
    return True


def _truncate(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        os.ftruncate(fd, 0)
    finally:
        os.close(fd)


class LogFollower:
    """Reads lines appended to a file since the last call; CR, LF and CRLF all end a line.

    A file that shrank was rotated (or cut by hand): what had not been read yet is taken from
    the newest rotated copy when that copy is the file as it was (at least as long as what was
    read), and reading goes on from the start of the file.
    """

    def __init__(self, path: Path, *, from_end: bool = True) -> None:
        self.path = path
        try:
            self._offset = path.stat().st_size if from_end else 0
        except OSError:
            self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        """Complete lines written since the last call."""
        carried = b""
        try:
            with self.path.open("rb") as handle:
                if os.fstat(handle.fileno()).st_size < self._offset:
                    carried = self._rest_of_rotated()
                    self._offset = 0
                handle.seek(self._offset)
                chunk = handle.read()
        except OSError:
            return []
        self._offset += len(chunk)
        data = (self._partial + carried + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, self._partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def _rest_of_rotated(self) -> bytes:
        """What followed the read offset in the newest rotated copy (b"" if it is not ours)."""
        try:
            with rotated_path(self.path, 1).open("rb") as handle:
                if os.fstat(handle.fileno()).st_size >= self._offset:
                    handle.seek(self._offset)
                    return handle.read()
        except OSError:
            pass
        self._partial = b""  # the rest of that line is nowhere to be read
        return b""

    def flush(self) -> list[str]:
        """Every line, the unterminated last one included (call once the process exited)."""
        lines = self.new_lines()
        if self._partial:
            lines.append(self._partial.decode("utf-8", "replace"))
            self._partial = b""
        return lines

    def tail(self, size: int = TAIL_BYTES) -> str:
        """The last ``size`` bytes of output, cut at a line boundary (across a rotation)."""
        data = _last_bytes(self.path, size)
        if len(data) < size:
            data = _last_bytes(rotated_path(self.path, 1), size - len(data)) + data
        if len(data) == size and b"\n" in data:
            data = data.split(b"\n", 1)[1]
        return data.decode("utf-8", "replace")


def _last_bytes(path: Path, size: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            end = handle.tell()
            handle.seek(max(0, end - size))
            return handle.read()
    except OSError:
        return b""
