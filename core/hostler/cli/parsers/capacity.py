"""The parser of ``hostler budget`` and ``hostler preview``."""

from __future__ import annotations

import argparse
from typing import Any

from hostler.capacity.bounds import MAX_SLOTS
from hostler.capacity.kv import KV_CACHE_TYPES
from hostler.cli.numbers import count
from hostler.cli.options import (
    URL_VARIABLE,
    add_client_options,
    add_wide_option,
    bytes_argument,
    path_argument,
    spillover_argument,
)
from hostler.cli.parsers import later

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Register ``budget`` and ``preview``."""
    budget: argparse.ArgumentParser = sub.add_parser(
        "budget", help="the host's memory budget, and what the ledger holds and for whom"
    )
    budget.add_argument(
        "--ledger",
        type=path_argument,
        help="ledger file (default $HOSTLER_LEDGER, else ~/.local/state/hostler/ledger.db)",
    )
    budget.add_argument("--json", action="store_true", help="print JSON")
    budget.add_argument(
        "--set",
        type=bytes_argument,
        metavar="BYTES|auto",
        help="the running daemon's budget, live: bytes (8G, 512MiB) or auto; needs the token",
    )
    budget.add_argument(
        "--spillover",
        type=spillover_argument,
        metavar="on|off|auto",
        help="the running daemon's RAM spillover, live; needs the token",
    )
    _daemon_options(budget)
    add_wide_option(budget)
    budget.set_defaults(run=later("hostler.cli.capacity", "run_budget"))

    preview: argparse.ArgumentParser = sub.add_parser(
        "preview",
        help="plan a model's launch (window, slots, bytes) without loading or evicting anything",
    )
    preview.add_argument(
        "model",
        type=path_argument,
        help="path of the model (a GGUF file for llamacpp); with --config, also an engine "
        "key or a model id of that config",
    )
    preview.add_argument(
        "--config",
        type=path_argument,
        help="price the model as this daemon config launches it: its engine's binary, "
        "options and flags, and its ledger (else $HOSTLER_CONFIG when set)",
    )
    preview.add_argument(
        "--engine",
        metavar="NAME",
        help="the engine whose adapter reads and prices the model (default: llamacpp)",
    )
    preview.add_argument(
        "--ctx", type=count(1, 16_777_216), help="per-slot context window to ask for"
    )
    preview.add_argument(
        "--slots", type=count(1, MAX_SLOTS), help="concurrent slots (requests served at once)"
    )
    preview.add_argument(
        "--kv",
        type=str.lower,
        choices=KV_CACHE_TYPES,
        metavar="TYPE",
        help=f"KV cache type: {', '.join(KV_CACHE_TYPES)}",
    )
    preview.add_argument(
        "--mmproj", type=path_argument, help="vision projector file, priced with the model"
    )
    preview.add_argument(
        "--policy", choices=["adaptive", "model-max"], default="adaptive", help="context sizing"
    )
    preview.add_argument(
        "--standalone", action="store_true", help="price the model as the only resident"
    )
    preview.add_argument(
        "--live", action="store_true", help="also clamp against live free RAM (system pressure)"
    )
    preview.add_argument(
        "--ledger", type=path_argument, help="ledger file (default as for `hostler budget`)"
    )
    preview.add_argument("--json", action="store_true", help="print JSON")
    _daemon_options(preview)
    preview.set_defaults(run=later("hostler.cli.capacity", "run_preview"))


def _daemon_options(parser: argparse.ArgumentParser) -> None:
    """``--url``, ``--token``, ``--data-dir``: ask the running daemon instead of this host."""
    add_client_options(
        parser,
        json_flag=False,
        url_help=f"ask the running hostler serve there instead (also when ${URL_VARIABLE} is set)",
    )
