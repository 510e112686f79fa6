"""Following an engine's log file: new lines as they land, and the tail kept for crash reports."""

from __future__ import annotations

from pathlib import Path

__all__ = ["TAIL_BYTES", "LogFollower"]

TAIL_BYTES = 64 * 1024


class LogFollower:
    """Reads lines appended to a file since the last call; CR, LF and CRLF all end a line."""

    def __init__(self, path: Path, *, from_end: bool = True) -> None:
        self.path = path
        try:
            self._offset = path.stat().st_size if from_end else 0
        except OSError:
            self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        """Complete lines written since the last call."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                chunk = handle.read()
        except OSError:
            return []
        self._offset += len(chunk)
        data = (self._partial + chunk).replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, self._partial = data.split(b"\n")
        return [line.decode("utf-8", "replace") for line in lines]

    def flush(self) -> list[str]:
        """Every line, the unterminated last one included (call once the process exited)."""
        lines = self.new_lines()
        if self._partial:
            lines.append(self._partial.decode("utf-8", "replace"))
            self._partial = b""
        return lines

    def tail(self, size: int = TAIL_BYTES) -> str:
        """The last ``size`` bytes of the file, cut at a line boundary."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(0, 2)
                end = handle.tell()
                handle.seek(max(0, end - size))
                data = handle.read()
        except OSError:
            return ""
        if len(data) == size and b"\n" in data:
            data = data.split(b"\n", 1)[1]
        return data.decode("utf-8", "replace")
