"""How ``hostler explain`` words figures: sizes, durations, exits and PP4's candidates."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping
from typing import Any

from hostler.capacity.victims import DEMAND_WINDOW

__all__ = [
    "candidates_of",
    "crash_how",
    "exit_how",
    "figures_of",
    "mapping_of",
    "pick",
    "secs",
    "size",
    "stop_why",
]


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


_STOP_WORDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "SP4": lambda d: (
        f"idle (SP4): unused for {secs(d.get('unused_for'))}, "
        f"idle timeout {secs(d.get('idle_timeout'))}"
    ),
    "SP5": lambda d: (
        f"memory pressure (SP5): unused for {secs(d.get('unused_for'))}, early-stop "
        f"threshold {secs(d.get('pressure_idle'))} under pressure"
    ),
    "SP3": lambda d: (
        f"health restart (SP3): {d.get('consecutive_failures')} failed probes in a "
        f"row, limit {d.get('health_failures')}"
    ),
    "PP4": lambda d: f"evicted (PP4) to make room for {d.get('for')}",
    "PP6": lambda _d: "evicted (PP6): unloaded while idle",
    "GA1": lambda d: (
        f"unloaded (GA1): its GPU slot ({d.get('slot')}) gave the card to another slot"
    ),
    "PP9": lambda _d: "evicted (PP9): the pool is retiring, work done",
    "PP10": lambda d: f"evicted (PP10): above the replica target {d.get('target')}",
}


def stop_why(reason: object, decision: Mapping[str, Any]) -> str:
    """Why a stop was asked, from its recorded ``reason`` and ``decision``: the rule and figures.

    ``idle (SP4): unused for 5.0 min, idle timeout 5.0 min``; an eviction to make room (PP4)
    names the engine it made room for. The one wording of a stop's cause: ``hostler explain``
    and the serve terminal's story both say it this way.
    """
    rule = decision.get("rule")
    say = _STOP_WORDS.get(rule) if isinstance(rule, str) else None
    if say is not None:
        return say(decision)
    return f"{reason} ({rule})" if rule else str(reason)


def crash_how(
    exit_code: int | None,
    number: int | None,
    panic_kind: str | None,
    panic_line: str | None,
    uptime: float | None,
    *,
    reached_ready: bool,
) -> str:
    """How an engine crashed: its end, its panic line, how long it ran, whether it was ready.

    ``exit code 1; panic kind oom: 'out of memory'; after 2.0 s, never became ready``: the one
    wording of a crash snapshot (``hostler explain`` and the serve terminal's story).
    """
    if panic_kind:
        panic = f"panic kind {panic_kind}"
        if panic_line:
            panic += f": {panic_line[:200]!r}"
    else:
        panic = "no panic line recognised in its output"
    ran = "" if uptime is None else f"after {secs(uptime)}"
    ready = "had become ready" if reached_ready else "never became ready"
    return f"{exit_how(exit_code, number)}; {panic}; {ran}{', ' if ran else ''}{ready}"
