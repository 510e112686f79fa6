"""Tools for testing hostler and its plugins: tiny real models (``hostler.testing.tiny_gguf``)."""

from __future__ import annotations
