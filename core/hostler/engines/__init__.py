"""Engine processes (drivers): spawn, identify, watch, stop, and adopt after a restart."""

from __future__ import annotations
