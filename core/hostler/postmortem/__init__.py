"""Post-mortem: answers and pictures from a recorded event log (issue 11).

Each module has one job and most are pure: they take recorded events and return answers; the
CLI modules (:mod:`hostler.cli`) do the reading and the printing.
"""

from __future__ import annotations
