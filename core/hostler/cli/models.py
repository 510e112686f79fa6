"""``hostler models``: the models the running ``hostler serve`` offers, and which are loaded.

Each with where it was found (``config``, ``models`` folder, ``huggingface``, ``ollama``,
``lmstudio``: docs/serve.md) and its size; the table stays within 80 columns (a long id is
cut with ``…``; ``--json`` has it whole).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from hostler.cli.client import checks_answers, daemon_url, fetch, token_of
from hostler.cli.load import model_of
from hostler.cli.tables import print_table, size, table

__all__ = ["MODELS_HEADERS", "model_rows", "run"]

#: The table's columns, in order (pinned by the tests).
MODELS_HEADERS = ("MODEL", "SOURCE", "SIZE", "RESIDENT", "RESERVED")


def model_rows(listed: Mapping[str, Any], engines: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One dict per model: its id, source, size, engines, residency and reserved bytes.

    The keys: ``id``, ``source``, ``size_bytes``, ``engines`` (keys), ``resident``,
    ``reserved_bytes``. ``listed`` is ``GET /v1/models``; ``engines`` is ``GET /api/engines``.
    ``reserved_bytes`` is what the daemon holds in the ledger for the model's engines now
    (None when nothing); ``source`` and ``size_bytes`` are None from a daemon that does not
    say them.
    """
    rows = []
    for model in listed.get("data") or []:
        mine = [e for e in engines.get("engines") or [] if model_of(e["key"]) == model["id"]]
        held = sum(int(e.get("bytes") or 0) for e in mine)
        rows.append(
            {
                "id": model["id"],
                "source": model.get("source"),
                "size_bytes": model.get("size_bytes"),
                "engines": [e["key"] for e in mine],
                "resident": bool(model.get("resident")),
                "reserved_bytes": held or None,
            }
        )
    return rows


@checks_answers
def run(args: argparse.Namespace) -> int:
    """Print the models."""
    url, token = daemon_url(args), token_of(args)
    assert url is not None  # noqa: S101 - a default is given
    rows = model_rows(fetch(url, "/v1/models", token), fetch(url, "/api/engines", token))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    grid = table(MODELS_HEADERS, ("SIZE", "RESERVED"), cut={"MODEL": 16, "SOURCE": 8})
    for row in rows:
        name = str(row["id"])
        grid.add_row(
            name,
            str(row["source"] or "-"),
            size(row["size_bytes"]),
            "yes" if row["resident"] else "no",
            size(row["reserved_bytes"]),
        )
    print_table(grid, wide=args.wide)
    if not rows:
        print(
            "(no models: put *.gguf files in DATA_DIR/models (found while serving), or give "
            "serve a --config)"
        )
    return 0
