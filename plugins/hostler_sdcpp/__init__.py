"""hostler adapter for sdcpp (placeholder)."""

from __future__ import annotations
