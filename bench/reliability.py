"""Summarize the chaos harness's run reports (``HOSTLER_CHAOS_REPORT`` JSON lines) as markdown.

    python3 dev.py run python bench/reliability.py soak.jsonl

Prints, per fault and log kind: runs, requests, what the clients saw (by reason), recovery
time (median and worst, seconds until every model answered again), events checked, and the
violations (target 0). ``docs/reliability.md`` holds the latest output.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any


def summarize(lines: list[dict[str, Any]]) -> str:
    """The markdown tables of a list of run reports."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for report in lines:
        groups[(report["fault"], report["log"])].append(report)
    out = [
        "| fault | log | runs | requests | clients saw | daemon back s (median / worst) | "
        "served again s (median / worst) | events checked | violations |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    violations: list[str] = []
    for (fault, log), reports in sorted(groups.items()):
        reasons: Counter[str] = Counter()
        for report in reports:
            reasons.update(report["reasons"])
        recovery = _spread([r["recovery_seconds"] for r in reports])
        back = _spread([r.get("down_seconds") for r in reports])
        seen = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common())
        broken = [v for r in reports for v in r["violations"]]
        violations += [
            f"seed {r['seed']} ({fault}, {log}): {v}" for r in reports for v in r["violations"]
        ]
        out.append(
            f"| {fault} | {log} | {len(reports)} | {sum(r['requests'] for r in reports)} | "
            f"{seen} | {back} | {recovery} | {sum(r['events'] for r in reports)} | {len(broken)} |"
        )
    if violations:
        out += ["", "Violations:", "", *(f"- {v}" for v in violations)]
    return "\n".join(out)


def _spread(values: list[float | None]) -> str:
    """``median / worst`` of the values given (``-`` when none)."""
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.1f} / {max(known):.1f}" if known else "-"


def main(argv: list[str]) -> int:
    """Read the reports named (a JSON line each) and print the summary."""
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(encoding="utf-8")
    print(summarize([json.loads(line) for line in text.splitlines() if line.strip()]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
