"""System memory: total RAM and reclaimable free RAM (rules R1–R2)."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import psutil

__all__ = [
    "is_apple_silicon",
    "parse_meminfo_available",
    "parse_vm_stat",
    "reclaimable_free_ram",
    "total_ram",
]

_VM_STAT_PAGES = (
    "Pages free",
    "Pages inactive",
    "Pages speculative",
    "Pages purgeable",
    "File-backed pages",
)


def total_ram() -> int:
    """Total system RAM in bytes."""
    return int(psutil.virtual_memory().total)


def is_apple_silicon() -> bool:
    """MacOS on arm64 (always unified memory)."""
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def parse_meminfo_available(text: str) -> int | None:
    """R2: ``MemAvailable`` of ``/proc/meminfo`` in bytes, or None when absent."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


def parse_vm_stat(text: str) -> int | None:
    """R2: free + inactive + speculative + purgeable + file-backed pages of ``vm_stat``, in bytes.

    None when the text is not ``vm_stat`` output or the pages sum to zero.
    """
    lines = text.splitlines()
    if not lines or "page size of" not in lines[0]:
        return None
    try:
        page_size = int(lines[0].split("page size of")[1].split()[0])
    except (IndexError, ValueError):
        return None
    pages = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip() in _VM_STAT_PAGES:
            try:
                pages += int(value.strip().rstrip("."))
            except ValueError:
                continue
    return pages * page_size if pages > 0 else None


def reclaimable_free_ram(total: int | None = None) -> int:
    """R1: RAM that could be had now, page cache included; never above 90% of total.

    Falls back to the OS's plain free figure when the platform's source fails (IN13: without
    reclaimable cache, a machine that just freed an engine looks full).
    """
    total = total if total is not None else total_ram()
    fallback = int(psutil.virtual_memory().free)
    parsed: int | None = None
    try:
        if platform.system() == "Darwin":
            output = subprocess.run(
                ["vm_stat"],  # noqa: S607 - a system tool, found on PATH as macOS ships it
                capture_output=True,
                text=True,
                timeout=3,
                check=False,
            ).stdout
            parsed = parse_vm_stat(output)
        else:
            parsed = parse_meminfo_available(Path("/proc/meminfo").read_text(encoding="ascii"))
    except (OSError, subprocess.SubprocessError):
        parsed = None
    if parsed is None:
        return fallback
    return max(min(parsed, int(0.9 * total)), fallback)
