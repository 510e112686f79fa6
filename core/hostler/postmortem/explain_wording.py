"""How ``hostler explain`` words figures: sizes, durations, exits and PP4's candidates."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from hostler.capacity.victims import DEMAND_WINDOW

__all__ = ["candidates_of", "exit_how", "figures_of", "mapping_of", "pick", "secs", "size"]


def candidates_of(decision: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """PP4's candidates by key, each with the figures explain cites (bad entries skipped)."""
    found: dict[str, dict[str, Any]] = {}
    raw = decision.get("candidates")
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            continue
        found[entry["key"]] = {
            "key": entry["key"],
            "bytes": _int(entry.get("bytes")),
            "recent_hits": _int(entry.get("recent_hits")),
            "idle_for": _float(entry.get("idle_for")),
            "busy": bool(entry.get("busy")),
            "draining": bool(entry.get("draining")),
        }
    return found


def figures_of(c: Mapping[str, Any]) -> str:
    """A candidate's demand figures: recent requests, idle time, size, busy."""
    hits = c["recent_hits"]
    busy = ", busy" if c["busy"] else ""
    return (
        f"{hits} request{'' if hits == 1 else 's'} in the last {DEMAND_WINDOW:.0f} s, idle "
        f"{secs(c['idle_for'])}, {size(c['bytes'])}{busy}"
    )


def mapping_of(value: object) -> dict[str, Any]:
    """A recorded decision, or {} when the row holds something else there."""
    return value if isinstance(value, dict) else {}


def pick(decision: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The named figures of a recorded decision (None where it lacks one)."""
    return {name: decision.get(name) for name in names}


def _int(value: Any) -> int:
    return value if type(value) is int else 0


def _float(value: Any) -> float:
    return float(value) if type(value) in (int, float) else 0.0


def secs(value: Any) -> str:
    """A duration in seconds as people read it (ms, s or min; ``? s`` when not a number)."""
    if type(value) not in (int, float):
        return "? s"
    if value >= 120:
        return f"{value / 60:.1f} min"
    if 0 < value < 1:
        return f"{value * 1000:.3g} ms"
    return f"{value:.3g} s"


def size(value: Any) -> str:
    """Bytes in binary units (``?`` when not a whole number)."""
    if type(value) is not int:
        return "?"
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{sign}{value / scale:.1f} {unit}"
    return f"{sign}{value} B"


def exit_how(code: int | None, number: int | None) -> str:
    """How a process ended: by a signal (named), an exit code, or unknown."""
    if number is not None:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "an unknown signal"
        return f"killed by signal {number} ({name})"
    if code is None:
        return "exit status unknown"
    return f"exit code {code}"
