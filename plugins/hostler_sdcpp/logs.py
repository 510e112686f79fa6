"""What ``sd-server`` prints: fatal lines (SV14) and generation progress (I5). Pure."""

from __future__ import annotations

import re

from hostler.plugin import Panic

__all__ = ["classify_line", "progress"]

#: I5: ``  |=====>    | 3/20 - 1.52s/it`` (or ``it/s``), possibly after a carriage return.
_PROGRESS = re.compile(r"\|[=> ]*\|\s*(\d{1,9})/(\d{1,9})\s*-\s*[\d.]+\s*(?:s/it|it/s)")
_FATAL: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"out of memory", re.IGNORECASE), "gpu-out-of-memory"),
    (re.compile(r"init model loader from file failed"), "model-unreadable"),
    (re.compile(r"new_sd_ctx_t failed"), "model-unreadable"),
    (re.compile(r"error: the following arguments are required"), "bad-arguments"),
    (re.compile(r"error: (?:unknown argument|invalid parameter for argument)"), "bad-arguments"),
    (re.compile(r"GGML_ASSERT"), "assertion"),
)


def classify_line(line: str) -> Panic | None:
    """A fatal ``sd-server`` line (out of memory, a model it cannot load, bad argv), or None."""
    text = line.strip()
    for pattern, kind in _FATAL:
        if pattern.search(text):
            return Panic(kind, text[:500])
    return None


def progress(line: str) -> tuple[int, int] | None:
    """I5: ``(step, total)`` of the last progress bar in ``line``, or None."""
    found = _PROGRESS.findall(line)
    if not found:
        return None
    step, total = found[-1]
    if int(total) <= 0 or int(step) > int(total):
        return None
    return int(step), int(total)
