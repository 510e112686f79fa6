"""hostler adapter for llamacpp (placeholder)."""

from __future__ import annotations
