"""``hostler explain TARGET``: every recorded decision that touched an engine, model, session..."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from hostler.cli.common import DamageReport, fleet_hosts_of, open_existing_log
from hostler.cli.timeparse import parse_moment
from hostler.errors import StoreError, UsageError
from hostler.postmortem.explain import explain, findings_json, resolve_target

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """Read the log, resolve the target, print its story."""
    now = datetime.now(UTC)
    since = parse_moment(args.since, now=now) if args.since else None
    until = parse_moment(args.until, now=now) if args.until else None
    if since is not None and until is not None and since > until:
        raise UsageError("explain: --since is after --until; nothing can match")
    hosts = fleet_hosts_of(args)
    if not hosts:
        status, document, lines = _explain(args, None, since, until)
        print(json.dumps(document, indent=2) if args.json else "\n".join(lines))
        return status
    statuses, documents, texts = [], {}, []
    for host in hosts:  # a fleet: each host's story of the target, by host
        try:
            status, document, lines = _explain(args, host, since, until)
        except StoreError as exc:  # one host's part unreadable: the others are still told
            status, document = 1, {"error": {"code": exc.code, "message": exc.message}}
            lines = [f"error [{exc.code}]: {exc.message}"]
            print(f"hostler: {lines[0]}", file=sys.stderr)
        statuses.append(status)
        documents[host] = document
        texts.append("\n".join([f"HOST {host}", *lines]))
    print(json.dumps({"hosts": documents}, indent=2) if args.json else "\n\n".join(texts))
    return max(statuses)


def _explain(
    args: argparse.Namespace, host: str | None, since: datetime | None, until: datetime | None
) -> tuple[int, dict[str, object], list[str]]:
    """One log's (or host's) answer: the exit status, the JSON document, the lines."""
    with open_existing_log(args, host=host) as store:
        records = list(store.read_all(until=until))
        damage = DamageReport(store.name)
    for record in records:
        if record.damage:
            damage.note(record.seq, record.damage)
    target = resolve_target(args.target, records)
    findings = explain(records, target, since=since, until=until)
    document: dict[str, object] = {
        "target": {
            "text": target.text,
            "kind": target.kind,
            "keys": sorted(target.keys),
            "session": target.session,
            "request": target.request,
        },
        "findings": findings_json(findings),
    }
    keys = ", ".join(sorted(target.keys))
    covers = "" if keys == target.text else f" ({keys or 'no engine'})"
    lines = [f"{target.kind} {target.text}{covers}: {len(findings)} decisions"]
    lines += [finding.line() for finding in findings]
    return damage.status(), document, lines
