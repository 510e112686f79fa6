"""The parser of ``hostler export`` and ``hostler import``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.numbers import count
from hostler.cli.options import add_log_options, add_log_source, path_argument
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register ``export`` and ``import``."""
    export: argparse.ArgumentParser = sub.add_parser(
        "export",
        help="write the log (or part of it) as JSON lines, optionally redacted",
        description="Write the log's rows as JSON lines (a header, one line per row, an end "
        "line) to stdout or -o FILE, to attach to a bug report; `hostler import` reads it back. "
        "Damaged rows are written as stored, flagged, and named on stderr (exit 1).",
    )
    add_log_source(export)
    export.add_argument("--since", help="rows recorded at or after (ISO-8601 UTC, or 15m, 2h)")
    export.add_argument("--until", help="rows recorded at or before (same forms as --since)")
    export.add_argument("--after-seq", type=count(0), default=0, help="only rows with seq > N")
    export.add_argument(
        "--redact",
        type=later("hostler.cli.export", "redaction_argument"),
        default="none",
        metavar="WHAT",
        help="paths (pseudonyms keeping the extension), prompts (user text removed, session "
        "ids pseudonymised), paths,prompts, all, or none (the default)",
    )
    export.add_argument(
        "-o", "--output", type=path_argument, help="write FILE (atomically) instead of stdout"
    )
    export.set_defaults(run=later("hostler.cli.export", "run_export"))

    imp: argparse.ArgumentParser = sub.add_parser(
        "import",
        help="fill an empty log from a `hostler export` file",
        description="Read an export (FILE, or - for stdin) into an EMPTY log, keeping every "
        "seq, time, payload and metadata, so that state, events and replay answer as on the "
        "original. The whole file is checked as it is written, in one transaction: a bad line "
        "is named and nothing is imported. A file (SQLite) or a database URL (PostgreSQL).",
    )
    imp.add_argument("file", metavar="FILE", help="the export file, or - for stdin")
    add_log_options(imp)
    imp.set_defaults(run=later("hostler.cli.export", "run_import"))
