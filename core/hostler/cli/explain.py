"""``hostler explain TARGET``: every recorded decision that touched an engine, model, session..."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from hostler.cli.common import DamageReport, add_log_options, open_existing_log
from hostler.cli.timeparse import parse_moment
from hostler.errors import UsageError
from hostler.postmortem.explain import explain, findings_json, resolve_target

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    """Register the subcommand."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "explain",
        help="say why: every decision that touched an engine, model, session or request",
        description=(
            "TARGET is an engine key (llamacpp:qwen:0), a model (qwen or llamacpp:qwen: every "
            "replica), a session id, or a request as ENGINE_KEY#N (N: the id its queue gave "
            "it). engine=, model=, session= or request= before it forces the kind."
        ),
    )
    parser.add_argument("target", help="engine key, model, session id, or ENGINE_KEY#N")
    add_log_options(parser)
    parser.add_argument("--since", help="only decisions recorded from this time on")
    parser.add_argument("--until", help="only decisions recorded up to this time")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Read the log, resolve the target, print its story."""
    now = datetime.now(UTC)
    since = parse_moment(args.since, now=now) if args.since else None
    until = parse_moment(args.until, now=now) if args.until else None
    if since is not None and until is not None and since > until:
        raise UsageError("explain: --since is after --until; nothing can match")
    with open_existing_log(args) as store:
        records = list(store.read_all(until=until))
        damage = DamageReport(store.name)
    for record in records:
        if record.damage:
            damage.note(record.seq, record.damage)
    target = resolve_target(args.target, records)
    findings = explain(records, target, since=since, until=until)
    if args.json:
        document = {
            "target": {
                "text": target.text,
                "kind": target.kind,
                "keys": sorted(target.keys),
                "session": target.session,
                "request": target.request,
            },
            "findings": findings_json(findings),
        }
        print(json.dumps(document, indent=2))
    else:
        keys = ", ".join(sorted(target.keys))
        covers = "" if keys == target.text else f" ({keys or 'no engine'})"
        print(f"{target.kind} {target.text}{covers}: {len(findings)} decisions")
        for finding in findings:
            print(finding.line())
    return damage.status()
