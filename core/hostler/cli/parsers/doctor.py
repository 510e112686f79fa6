"""The parser of ``hostler doctor``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.cli.options import add_settings_options
from hostler.cli.parsers import later

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    """Register ``doctor``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "doctor",
        help="check engines, CPU, GPUs, data directory, token, port and models: OK or the fix",
    )
    add_settings_options(
        parser,
        "the TOML config hostler serve would use (else $HOSTLER_CONFIG, else the models it "
        "would find)",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(run=later("hostler.cli.doctor", "run"))
