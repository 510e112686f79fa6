"""Post-mortem: answers and pictures from a recorded event log, without the machine that wrote it.

Each module has one job and is pure where it can be (records in, answers out); the CLI modules
in :mod:`hostler.cli` do the I/O.
"""

from __future__ import annotations
