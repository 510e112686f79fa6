"""``hostler doctor``: is this machine ready for ``hostler serve``? One line a check, OK or the fix.

The engines found (and ``llama-server --version``), what this CPU can run with that build (L22:
what the log learned), NVIDIA cards, the data directory, the token, the port, the models. It
reads the settings ``hostler serve`` would use (``--config``, ``HOSTLER_*``, the data
directory's models). Exit status 0 when every check is OK, 1 when one fails. Everything it
needs is imported when it runs: ``hostler --help`` does not pay for it.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

from hostler.drivers.doctor_verdicts import Finding

__all__ = ["render", "run"]

#: How each status starts its line.
_MARK = {"ok": "OK", "fail": "FAIL", "absent": "--"}
#: The check column's width (the longest name, ``llama-server``).
_NAME_WIDTH = 12


def run(args: argparse.Namespace) -> int:
    """Run every check, print them (or JSON); 1 when one failed."""
    from hostler._version import __version__  # noqa: PLC0415

    findings, config_dir = _examined(args)
    failed = sum(finding.status == "fail" for finding in findings)
    if args.json:
        print(
            json.dumps(
                {
                    "version": __version__,
                    "data_dir": None if config_dir is None else str(config_dir),
                    "ok": not failed,
                    "checks": [asdict(finding) for finding in findings],
                },
                indent=2,
            )
        )
    else:
        where = "unknown" if config_dir is None else str(config_dir)
        print(f"hostler {__version__}, data directory {where}")
        print(render(findings))
        total = len(findings)
        print(f"{failed} of {total} checks failed" if failed else f"all {total} checks OK")
    return 1 if failed else 0


def _examined(args: argparse.Namespace) -> tuple[list[Finding], Path | None]:
    """The findings, and the data directory they are about (None: it could not be told).

    A config or setting that ``hostler serve`` would refuse is a failed check of its own
    (``config``); the rest are then judged on the default data directory where one can be
    told, and without it otherwise.
    """
    from hostler.cli.daemon import serve_config  # noqa: PLC0415 - the settings serve uses
    from hostler.config import discovered_config, with_places  # noqa: PLC0415
    from hostler.drivers.doctor import examine  # noqa: PLC0415
    from hostler.errors import HostlerError  # noqa: PLC0415
    from hostler.settings_env import read_overrides  # noqa: PLC0415

    try:
        env = read_overrides(os.environ)
        config = serve_config(args.config, args.data_dir)
    except HostlerError as exc:
        refused = Finding(
            "config",
            "fail",
            f"hostler serve would refuse its settings: [{exc.code}] {exc.message}",
            "fix the setting the line names (docs/errors.md)",
        )
        try:
            fallback = with_places(discovered_config(args.data_dir), os.environ)
        except HostlerError:
            return [refused, *examine(None, models_dir=None, configured=False)], None
        rest = examine(fallback, models_dir=None, configured=False)
        return [refused, *rest], fallback.data_dir
    configured = args.config is not None or env.config is not None
    findings = examine(config, models_dir=env.models_dir, configured=configured)
    return findings, config.data_dir


def render(findings: list[Finding]) -> str:
    """One line a finding: ``OK``, ``FAIL`` (with its fix) or ``--`` (optional, not there)."""
    lines = []
    for finding in findings:
        fix = f"; fix: {finding.fix}" if finding.fix else ""
        mark = _MARK[finding.status]
        lines.append(f"{mark:<5} {finding.check:<{_NAME_WIDTH}}  {finding.detail}{fix}")
    return "\n".join(lines)
