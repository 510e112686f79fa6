"""Probes (drivers): what the machine looks like now, turned into observation events."""

from __future__ import annotations
