"""Bounds on what a launch may ask for, shared by the planner, the config, plugins and the CLI."""

from __future__ import annotations

__all__ = ["MAX_SLOTS"]

#: S2: the most slots (``--parallel``) an engine may be asked for. Each slot keeps at least
#: 256 KV cells and its own compute state; past a thousand the count is a typo, and the
#: planner's slot ladder (C6) and growth (C7) walk the slots, so this bounds them.
MAX_SLOTS = 1024
