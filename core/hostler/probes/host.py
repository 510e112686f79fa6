"""Facts about this host that identify it across processes: which boot we are in."""

from __future__ import annotations

from pathlib import Path

import psutil

__all__ = ["boot_id"]


def boot_id() -> str:
    """This boot's identity (Linux ``boot_id``; else the boot time)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return f"boot@{psutil.boot_time():.0f}"
