"""Drivers: the I/O half of the capacity loop (the host-wide ledger, launch measurement).

The pure rules they execute live in :mod:`hostler.capacity`; nothing there imports from here.
"""

from __future__ import annotations
