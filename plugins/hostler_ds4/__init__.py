"""hostler adapter for ds4 (placeholder)."""

from __future__ import annotations
