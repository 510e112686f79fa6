"""Stand-in engines for supervisor, pool and runtime tests: ``hostler.testing``'s fake engine.

Both run :mod:`hostler.testing.fake_server` (answers ``/health``, the OpenAI completions,
``/busy/<seconds>``, prints ``n`` lines on ``/spam/<n>`` and ``asked for <path>`` for any other
``GET``); they keep the names and constructors these tests have always used.
"""

from __future__ import annotations

from pathlib import Path

from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter


class FakeEngine(FakeEngineAdapter):
    """The fake engine, instant and well-behaved (engine name ``fake``)."""

    engine_type = "fake"

    def __init__(self, folder: Path) -> None:
        del folder  # the server script ships with hostler.testing: nothing to write
        super().__init__()


class BallastEngine(FakeEngineAdapter):
    """An engine of a known size that can be slow to load (engine name ``ballast``).

    It holds ``mib`` MiB of touched memory (so its measured footprint is known) and keeps its
    port closed for ``load_seconds`` before it answers.
    """

    engine_type = "ballast"

    def __init__(self, folder: Path, mib: int = 0, load_seconds: float = 0.0) -> None:
        del folder
        super().__init__(Behaviour(ballast_mib=mib, load_seconds=load_seconds))
        self.mib = mib
        self.load_seconds = load_seconds
