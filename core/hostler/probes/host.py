"""Facts about this host that identify it across processes: its boot, a process's start."""

from __future__ import annotations

import os
from pathlib import Path

import psutil

__all__ = ["boot_id", "same_start", "started_since_boot"]

#: The kernel's clock ticks per second, the unit of a process's start in ``/proc/<pid>/stat``.
_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

#: ``starttime``'s place among the fields after the command name in ``/proc/<pid>/stat``
#: (field 22 of proc(5); the fields after ``(comm)`` begin at field 3).
_STARTTIME_FIELD = 22 - 3


def boot_id() -> str:
    """This boot's identity (Linux ``boot_id``; else the boot time)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return f"boot@{psutil.boot_time():.0f}"


def started_since_boot(pid: int) -> float | None:
    """Seconds from this boot to the start of process ``pid``, in the kernel's own ticks.

    A wall-clock start time (what psutil's ``create_time`` gives) is the boot time plus this,
    and the kernel moves the boot time whenever the system clock is set: NTP stepping a clock
    that was wrong, ``date -s``, a virtual machine restored from a snapshot. This count never
    moves. None where the kernel does not say (no ``/proc``), or the process is gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: the fields start after the last ")"
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[_STARTTIME_FIELD]) / _TICKS_PER_SECOND
    except (IndexError, ValueError):
        return None


def same_start(
    process: psutil.Process, *, wall: float, since_boot: float | None, tolerance: float
) -> bool:
    """Whether ``process`` started when a record says the process it names started.

    By the ticks since boot when the record has them and the kernel gives them (exact: a
    clock step cannot move them); otherwise by the wall-clock start within ``tolerance``
    (records written before the ticks were, and kernels without ``/proc``).

    Raises:
        psutil.NoSuchProcess: The process is gone.
    """
    if since_boot is not None:
        now = started_since_boot(process.pid)
        if now is not None:
            return abs(now - since_boot) < 0.5 / _TICKS_PER_SECOND
    return abs(process.create_time() - wall) <= tolerance
