"""This machine's CPU, named so that what an engine build cannot run on it is remembered."""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

__all__ = ["cpu_flags", "cpu_identity", "cpu_summary"]

_CPUINFO = Path("/proc/cpuinfo")
#: The most of ``/proc/cpuinfo`` read (a machine with hundreds of cores repeats one block).
_MAX_READ = 256 * 1024


@functools.cache
def _first_block() -> dict[str, str]:
    """The first processor's ``/proc/cpuinfo`` fields (empty where there is none)."""
    try:
        with _CPUINFO.open(encoding="ascii", errors="replace") as info:
            text = info.read(_MAX_READ)
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_summary() -> tuple[str, frozenset[str]]:
    """The CPU's model name and its feature flags (``flags`` on x86, ``Features`` on Arm)."""
    block = _first_block()
    name = block.get("model name") or block.get("Hardware") or platform.processor()
    flags = block.get("flags") or block.get("Features") or ""
    return name or platform.machine() or "unknown", frozenset(flags.split())


def cpu_flags() -> frozenset[str]:
    """This host's CPU feature flags (``/proc/cpuinfo``'s first processor; none elsewhere)."""
    return cpu_summary()[1]


@functools.cache
def cpu_identity() -> str:
    """``MACHINE/sha256(flags)[:12]``: two CPUs with the same features are the same to a build.

    The name is left out: what a build can run depends on the instructions the CPU has, and a
    name changes with nothing else (a microcode update's stepping, a cloud's relabelling).
    """
    _name, flags = cpu_summary()
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return f"{platform.machine() or 'unknown'}/{digest}"
