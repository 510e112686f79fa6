"""hostler's built-in llama.cpp adapter, registered like any third-party plugin."""

from __future__ import annotations

from hostler.plugin import Register, hookimpl
from hostler_llamacpp.adapter import LlamaCppAdapter

__all__ = ["LlamaCppAdapter", "register_engines"]


@hookimpl
def register_engines(register: Register) -> None:
    """Register the llama.cpp adapter."""
    register(LlamaCppAdapter)
