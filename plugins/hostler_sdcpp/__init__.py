"""hostler's built-in stable-diffusion.cpp adapter (``sd-server``, images; §3.4)."""

from __future__ import annotations

from hostler.plugin import Register, hookimpl
from hostler_sdcpp.adapter import SdCppAdapter

__all__ = ["SdCppAdapter", "register_engines"]


@hookimpl
def register_engines(register: Register) -> None:
    """Register the stable-diffusion.cpp adapter."""
    register(SdCppAdapter)
