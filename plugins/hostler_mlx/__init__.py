"""hostler's built-in MLX adapter (``mlx_lm.server``), registered like any third-party plugin."""

from __future__ import annotations

from hostler.plugin import Register, hookimpl
from hostler_mlx.adapter import MlxAdapter

__all__ = ["MlxAdapter", "register_engines"]


@hookimpl
def register_engines(register: Register) -> None:
    """Register the MLX adapter."""
    register(MlxAdapter)
