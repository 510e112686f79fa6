"""``hostler whatif LOG``: the recorded requests replayed under another budget, policy or width.

It prints three columns per figure: what *happened* (read straight from the log), what the
simulator gives under the *recorded* settings (how faithful it is to this log), and the
*what-if* under the changed settings (PM22-PM25).
"""

from __future__ import annotations

import argparse
import heapq
import json
from typing import Any

from hostler.cli.common import DamageReport, open_existing_log, take_log_argument
from hostler.cli.ledger_rows import recorded_ledger_rows
from hostler.cli.tables import size
from hostler.errors import UsageError
from hostler.policies.eviction import (
    BUILTIN_EVICTION_POLICIES,
    EvictionPolicy,
    eviction_policy,
    valid_policy_name,
)
from hostler.postmortem.figures import Figures, KeyFigures, recorded_figures
from hostler.postmortem.whatif import simulate
from hostler.postmortem.workload import Settings, Workload, workload_from

__all__ = ["changed_settings", "policy_argument", "report_lines", "run"]


def policy_argument(text: str) -> str:
    """An argparse type: an eviction policy's name (it need not be installed here)."""
    if not valid_policy_name(text):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a policy name (lowercase letters, digits and dashes)"
        )
    return text


def changed_settings(recorded: Settings, args: argparse.Namespace) -> Settings:
    """The recorded settings with the flags given applied."""
    return Settings(
        recorded.budget if args.budget is None else args.budget,
        recorded.policy if args.policy is None else args.policy,
        recorded.spillover if args.spillover is None else args.spillover,
        recorded.slots if args.slots is None else args.slots,
        recorded.follow_budget and args.budget is None,  # a budget given holds throughout
    )


def _policies(*names: str) -> dict[str, EvictionPolicy]:
    """Plugins' eviction policies, loaded only when a name is not a built-in one."""
    if all(name in BUILTIN_EVICTION_POLICIES for name in names):
        return {}
    from hostler.pluginhost import PluginHost  # noqa: PLC0415 - plugins load only if needed

    return dict(PluginHost().load().eviction_policies)


def run(args: argparse.Namespace) -> int:
    """Read the log, simulate twice, print side by side."""
    if args.policy is not None:  # a name no policy has is said before the log is read
        eviction_policy(args.policy, _policies(args.policy))
    take_log_argument(args, "whatif")
    with open_existing_log(args) as store:
        rows = list(store.read_all())
        damage = DamageReport(store.name)
        ledger = recorded_ledger_rows(store, rows)
    if ledger:  # the daemon's memory decisions, kept in the host ledger's own file
        rows = list(heapq.merge(rows, ledger, key=lambda row: row.recorded_at))
    for row in rows:
        if row.damage:
            damage.note(row.seq, row.damage)
    workload = workload_from(rows)
    happened = recorded_figures(rows)
    settings = changed_settings(workload.settings, args)
    policies = _policies(workload.settings.policy, settings.policy)
    try:
        replayed = simulate(workload, workload.settings, policies=policies)
    except UsageError:  # a log recorded under a policy this hostler lacks: said, not replayed
        replayed = None
    whatif = simulate(workload, settings, policies=policies)
    if args.json:
        print(json.dumps(_as_json(workload, settings, happened, replayed, whatif), indent=2))
    else:
        print("\n".join(report_lines(workload, settings, happened, replayed, whatif)))
    return damage.status()


def _settings_json(settings: Settings) -> dict[str, Any]:
    return {
        "budget": settings.budget,
        "policy": settings.policy,
        "spillover": settings.spillover,
        "slots": settings.slots,
        "follow_budget": settings.follow_budget,
    }


def _as_json(
    workload: Workload,
    settings: Settings,
    happened: Figures,
    replayed: Figures | None,
    whatif: Figures,
) -> dict[str, Any]:
    return {
        "requests": len(workload.requests),
        "recorded_settings": _settings_json(workload.settings),
        "whatif_settings": _settings_json(settings),
        "happened": happened.as_dict(),
        "replayed": None if replayed is None else replayed.as_dict(),
        "whatif": whatif.as_dict(),
        "skipped": dict(workload.skipped),
        "notes": list(workload.notes),
    }


def _describe(settings: Settings) -> list[str]:
    slots = "as launched" if settings.slots is None else str(settings.slots)
    return [
        size(settings.budget),
        settings.policy,
        "on" if settings.spillover else "off",
        slots,
    ]


def _cells(figures: KeyFigures | None) -> list[str]:
    if figures is None:
        return ["-"] * 7
    w, served = figures.waits, figures.served
    return [
        str(figures.evictions),
        str(figures.refusals),
        str(figures.cold_starts),
        str(figures.restores),
        str(w.count),
        f"{w.median:.3f}/{w.p95:.3f}/{w.max:.3f}",
        f"{served.median:.3f}/{served.p95:.3f}/{served.max:.3f}",
    ]


#: ``wait``: in the queue, until a queue slot; ``served``: from arrival to the engine
#: (the queue, the engine's start, a slot of its gate): what the client waited, all of it.
_ROWS = (
    "evictions",
    "refusals",
    "cold starts",
    "restores",
    "waits",
    "wait s med/p95/max",
    "served s med/p95/max",
)


def report_lines(
    workload: Workload,
    settings: Settings,
    happened: Figures,
    replayed: Figures | None,
    whatif: Figures,
) -> list[str]:
    """The report as people read it: settings, then each figure in three columns."""
    width = 24
    head = f"{'':<22}{'happened':>{width}}{'replayed':>{width}}{'what-if':>{width}}"
    lines = [f"{len(workload.requests)} requests for {len(workload.models)} engine(s)", ""]
    # the replay runs under the recorded settings: they stand in its column
    lines.append(f"{'settings':<22}{'':>{width}}{'recorded':>{width}}{'what-if':>{width}}")
    for name, old, new in zip(
        ("budget", "eviction policy", "spillover", "slots per engine"),
        _describe(workload.settings),
        _describe(settings),
        strict=True,
    ):
        lines.append(f"  {name:<20}{'':>{width}}{old:>{width}}{new:>{width}}")
    sections: list[tuple[str, KeyFigures | None, KeyFigures | None, KeyFigures | None]] = [
        ("total", happened.total, None if replayed is None else replayed.total, whatif.total)
    ]
    keys = sorted(set(happened.by_key) | set(whatif.by_key))
    for key in keys:
        sections.append(
            (
                key,
                happened.by_key.get(key),
                None if replayed is None else replayed.by_key.get(key),
                whatif.by_key.get(key),
            )
        )
    for title, a, b, c in sections:
        lines += ["", head.replace(" " * 22, f"{title[:21]:<22}", 1)]
        for row, x, y, z in zip(_ROWS, _cells(a), _cells(b), _cells(c), strict=True):
            lines.append(f"  {row:<20}{x:>{width}}{y:>{width}}{z:>{width}}")
    if replayed is None:
        lines += ["", f"note: the recorded policy {workload.settings.policy!r} is not known here"]
    lines += [f"note: {note}" for note in workload.notes]
    lines += [f"skipped: {n} row(s): {why}" for why, n in workload.skipped.items()]
    return lines
