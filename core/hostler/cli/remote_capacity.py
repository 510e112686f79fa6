"""``hostler budget`` and ``hostler preview`` against the running daemon (``--url``).

The local commands (``cli/capacity.py``) read the host and the ledger directly; these ask the
daemon, which answers with what it enforces now, and change its budget live (with the token).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from hostler.capacity.origin import floor_problem
from hostler.cli.client import call, checks_answers, fetch, token_of
from hostler.cli.load import model_of
from hostler.cli.options import bytes_argument, spillover_argument
from hostler.cli.tables import print_table, size, table
from hostler.errors import UsageError

__all__ = [
    "BUDGET_HEADERS",
    "LOCAL_PREVIEW_OPTIONS",
    "budget_lines",
    "bytes_argument",
    "run_budget",
    "run_preview",
    "spillover_argument",
]

#: The reservation table's columns (pinned by the tests).
BUDGET_HEADERS = ("KEY", "BYTES", "OWNER", "PID")
#: ``hostler preview``'s options that price a file here, meaningless against the daemon.
LOCAL_PREVIEW_OPTIONS = (
    "engine", "ctx", "slots", "kv", "mmproj", "standalone", "live", "ledger", "config",
)  # fmt: skip


def budget_lines(snapshot: Mapping[str, Any]) -> list[str]:
    """The daemon's budget as people read it (``snapshot``: ``GET /api/budget``)."""
    spill = snapshot.get("ram_spillover") or {}
    pools = snapshot.get("pools") or {}
    how = "set by the operator" if snapshot.get("overridden") else "automatic"
    enforced = "" if snapshot.get("enforced", True) else " (NOT enforced: under 1 GiB)"
    spilled = "on" if spill.get("allowed") else "off"
    spilled += " (set)" if spill.get("overridden") else " (automatic)"
    return [
        f"budget     {size(snapshot.get('budget'))} ({how}; automatic would be "
        f"{size(snapshot.get('auto_budget'))}){enforced}",
        f"committed  {size(snapshot.get('committed') or 0)} in "
        f"{len(snapshot.get('by_key') or [])} reservation(s)",
        f"memory     {pools.get('kind', '?')}: fast {size(pools.get('fast'))}, RAM "
        f"{size(snapshot.get('system_ram'))}",
        f"spillover  {spilled}; co-residency ceiling {size(spill.get('co_residency_bytes'))}",
    ]


@checks_answers
def run_budget(args: argparse.Namespace, url: str) -> int:
    """Show the daemon's budget; with ``--set`` / ``--spillover``, change it first (live)."""
    problem = floor_problem(args.set) if isinstance(args.set, int) else None
    if problem is not None:  # CB1: refused here, as the daemon would, before asking it
        raise UsageError(f"--set: {problem}")
    token = token_of(args)
    change: dict[str, Any] = {}
    if args.set is not None:
        change["bytes"] = None if args.set == "auto" else args.set
    if args.spillover is not None:
        change["spillover"] = None if args.spillover == "auto" else args.spillover
    if change:
        snapshot = call("PUT", url, "/api/budget", token, body=change)
    else:
        snapshot = fetch(url, "/api/budget", token)
    if not isinstance(snapshot, dict) or type(snapshot.get("budget")) is not int:
        raise ValueError("no budget in the answer")  # one line, by checks_answers
    if args.json:
        print(json.dumps(snapshot, indent=2))
        return 0
    print("\n".join(budget_lines(snapshot)))
    rows = snapshot.get("by_key") or []
    if rows:
        print()
        grid = table(BUDGET_HEADERS, ("BYTES", "PID"), drop=("PID",), cut={"OWNER": 12, "KEY": 20})
        for row in rows:
            owner = str(row.get("owner"))
            if row.get("owner_alive") is False:
                owner += " (gone)"
            grid.add_row(row["key"], size(row.get("bytes")), owner, str(row.get("pid") or "-"))
        print_table(grid, wide=args.wide)
    return 0


def _key_for(url: str, token: str | None, name: str) -> str:
    """An engine key as given, else the first engine of the model id ``name``."""
    if ":" in name:
        return name
    engines = fetch(url, "/api/engines", token).get("engines") or []
    return next((e["key"] for e in engines if model_of(e["key"]) == name), name)


@checks_answers
def run_preview(args: argparse.Namespace, url: str) -> int:
    """What the daemon would plan and reserve for an engine now; exit 3 when it does not fit."""
    used = [f"--{o}" for o in LOCAL_PREVIEW_OPTIONS if getattr(args, o, None) not in (None, False)]
    if args.policy != "adaptive":
        used.append("--policy")
    if used:
        raise UsageError(
            f"{', '.join(used)}: only for a local preview of a model file (without --url / "
            "HOSTLER_URL); the daemon previews each engine as it is configured"
        )
    token = token_of(args)
    key = _key_for(url, token, str(args.model))
    plan = fetch(url, f"/api/preview/{quote(key, safe=':')}", token)
    if args.json:
        print(json.dumps({"key": key, **plan}, indent=2))
    else:
        verdict = "fits" if plan.get("admitted") else "DOES NOT FIT"
        print(
            f"engine   {key}\n"
            f"plan     {verdict}: {plan.get('context_window')} tokens per slot × "
            f"{plan.get('slots')} slot(s), KV {plan.get('kv_type')}\n"
            f"reserved {size(plan.get('reserved_bytes'))}: what the ledger would hold "
            f"(planned {size(plan.get('planned_bytes'))})"
        )
        if plan.get("denial"):
            print(f"denied   {plan['denial']}")
    return 0 if plan.get("admitted") else 3
