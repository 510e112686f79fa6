"""hostler's built-in ds4 adapter, registered like any third-party plugin."""

from __future__ import annotations

from hostler.plugin import Register, hookimpl
from hostler_ds4.adapter import Ds4Adapter

__all__ = ["Ds4Adapter", "register_engines"]


@hookimpl
def register_engines(register: Register) -> None:
    """Register the ds4 adapter."""
    register(Ds4Adapter)
