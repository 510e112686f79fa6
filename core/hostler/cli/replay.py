"""``hostler replay --verify LOG``: re-derive every recorded decision with the current code.

The pure part is :mod:`hostler.postmortem.verify`; this module opens the log, loads the
plugins' eviction policies (a decision made by a plugin's policy re-derives with it), and
prints each difference with both answers side by side. Exit status: 0 when every re-derived
decision agrees, 1 when any differs (PM16).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from hostler.cli.common import open_existing_log, take_log_argument
from hostler.errors import UsageError
from hostler.pluginhost import PluginHost
from hostler.postmortem.verify import Context, Finding, VerifyReport, verify_records

__all__ = ["format_report", "run"]

#: Decisions that cannot be re-derived are listed one per line up to this many.
_SHOWN = 20


def run(args: argparse.Namespace) -> int:
    """Check the log; print the report."""
    if not args.verify:
        raise UsageError("replay: say what to replay for: --verify (re-derive every decision)")
    take_log_argument(args, "replay")
    logging.getLogger("hostler.pluginhost").setLevel(logging.ERROR)
    ctx = Context(eviction_policies=PluginHost().load().eviction_policies)
    with open_existing_log(args) as store:
        name = store.name
        report = verify_records(store.read_all(), ctx)
    if args.json:
        print(json.dumps({"log": name, **report.as_dict()}, indent=2, sort_keys=True))
    else:
        print("\n".join(format_report(report)))
    for row in report.unreadable[:_SHOWN]:
        print(f"hostler: warning: {name}: seq {row.seq}: {row.why} (not checked)", file=sys.stderr)
    return 1 if report.differences else 0


def _answer(answer: dict[str, Any] | None) -> str:
    if answer is None:
        return "-"
    return " ".join(f"{k}={json.dumps(v, sort_keys=True)}" for k, v in answer.items())


def _difference(f: Finding) -> list[str]:
    lines = [
        f"seq {f.seq}  {f.type}  {f.stream}  {f.rule}  differs in: {', '.join(f.fields)}",
        f"  recorded:   {_answer(f.recorded)}",
        f"  re-derived: {_answer(f.rederived)}",
    ]
    if f.why:
        lines.append(f"  note: {f.why}")
    return lines


def format_report(report: VerifyReport) -> list[str]:
    """Readable lines: each difference side by side, the undecidable, then the summary."""
    lines: list[str] = []
    for f in report.differences:
        lines.extend(_difference(f))
    shown = report.not_rederivable[:_SHOWN]
    for f in shown:
        lines.append(f"seq {f.seq}  {f.type}  {f.rule}: not re-derivable (missing {f.why})")
    if len(report.not_rederivable) > len(shown):
        lines.append(f"... {len(report.not_rederivable) - len(shown)} more not re-derivable")
    lines.append(report.summary())
    return lines
