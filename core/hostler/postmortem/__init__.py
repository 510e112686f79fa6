"""Post-mortem: answers and pictures from an event log, without the machine that wrote it."""

from __future__ import annotations
