"""Post-mortem: answers and checks computed from a recorded event log (pure where possible)."""

from __future__ import annotations
