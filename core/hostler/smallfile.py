"""Read a small file hostler does not control, within bounds and without waiting on it.

A model's ``config.json``, a build sidecar: each is read as a whole, so it must be a regular
file of bounded size. ``stat`` then ``read_bytes`` is not enough: a FIFO reports size 0 and
then blocks the read forever, and a symbolic link to ``/dev/zero`` reports size 0 and reads
without end. :func:`read_small_file` opens without blocking, checks the OPEN descriptor
(``fstat``: what was opened, not what the name pointed to a moment before), and reads at most
``limit + 1`` bytes, whatever the file claims.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

__all__ = ["read_small_file"]

_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_small_file(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, of at most ``limit`` bytes.

    Symbolic links are followed (a model cache links its files), but what is read must be a
    regular file: a FIFO is refused without waiting for a writer, a device without reading it.

    Raises:
        OSError: It cannot be opened or read (``FileNotFoundError`` when absent).
        ValueError: ``is a FIFO (named pipe)``, ``is a directory``..., or ``larger than
            LIMIT bytes`` (one line, without the path: the caller names it).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            raise ValueError(f"is {kind}, not a regular file")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data
