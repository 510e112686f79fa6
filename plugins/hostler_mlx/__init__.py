"""hostler adapter for mlx (placeholder)."""

from __future__ import annotations
