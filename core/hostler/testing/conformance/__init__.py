"""The adapter conformance suite: the engine adapter contract, checked for any adapter.

One import and two fixtures run it against your adapter::

    # tests/test_conformance.py
    from pathlib import Path

    import pytest
    from hostler.testing.conformance import AdapterConformance
    from my_plugin import MyAdapter


    class TestMyAdapter(AdapterConformance):
        @pytest.fixture
        def adapter(self) -> MyAdapter:
            return MyAdapter()

        @pytest.fixture
        def model(self, tmp_path_factory) -> Path:
            return make_a_tiny_model(tmp_path_factory.mktemp("model"))

Every check is one test method (``test_*``), so a failure names the rule it broke. The static
checks call the adapter's methods; the live ones (``test_live_*``) run the engine it builds
under hostler's real supervisor, as a real process with a real event log and ledger: started,
probed for readiness, asked for a completion, measured against its price, stopped, adopted by a
fresh supervisor after a simulated daemon restart, and asked for its health and a second
completion while it streams a first. A subclass tunes the suite with class attributes
(:attr:`AdapterConformance.serves_completions`, :attr:`~AdapterConformance.startup_timeout`,
...), and may override any fixture or check. New checks are added as new methods; the contract
grows with defaults, so a suite that passed keeps passing for adapters that keep the rules.

The suite needs neither the pytest plugin nor an async test runner (the live checks drive
their own event loop).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from hostler.plugin import EngineAdapter, LaunchSpec
from hostler.testing.conformance.busy import BusyChecks
from hostler.testing.conformance.live import Live, LiveChecks
from hostler.testing.conformance.static import BENIGN_LINES as BENIGN_LINES
from hostler.testing.conformance.static import (
    EXTRA_ARGS,
    IdentityChecks,
    LaunchChecks,
    NamingChecks,
    OutputChecks,
    PricingChecks,
)
from hostler.testing.conformance.static import ODD_LINES as ODD_LINES

__all__ = ["EXTRA_ARGS", "AdapterConformance", "Live"]


# the bases in reverse: pytest runs inherited checks in reverse MRO, names and registration first
class AdapterConformance(
    BusyChecks, LiveChecks, IdentityChecks, PricingChecks, OutputChecks, LaunchChecks, NamingChecks
):
    """The contract's checks; subclass it as ``Test...`` and supply ``adapter`` and ``model``.

    Class attributes a subclass may set:
        serves_completions: The engine answers ``completion_path`` with an OpenAI completion.
        completion_path: Where the live check asks for one.
        completion_body: What it sends.
        stream_body: The long streamed completion the checks of a busy engine send.
        startup_timeout: Seconds the live checks give the engine to become ready.
        stop_grace: Seconds between the stop's SIGTERM and SIGKILL.
        ctx_per_slot: The context the launch specs ask for.
        price_tolerance, price_slack: How far the measured footprint of a ready launch may
            exceed the adapter's estimate (a share of it, or bytes, whichever allows more).

    The checks are grouped by what they look at (:mod:`hostler.testing.conformance.static`,
    :mod:`hostler.testing.conformance.live`, :mod:`hostler.testing.conformance.busy`); the
    class attributes and :meth:`launch_spec` come from
    :class:`~hostler.testing.conformance.settings.ConformanceSettings`.
    """

    # -- fixtures a subclass supplies ------------------------------------------------------

    @pytest.fixture
    def adapter(self) -> EngineAdapter:
        """The adapter under test: override this fixture."""
        raise NotImplementedError(
            f"{type(self).__name__}: override the 'adapter' fixture to return your adapter"
        )

    @pytest.fixture
    def model(self) -> Path:
        """A model the adapter's engine loads (small, for speed): override this fixture."""
        raise NotImplementedError(
            f"{type(self).__name__}: override the 'model' fixture to return a model path"
        )

    @pytest.fixture
    def plugin_module(self, adapter: EngineAdapter) -> ModuleType:
        """The module your entry point names (default: the adapter's top-level package)."""
        return importlib.import_module(type(adapter).__module__.split(".", maxsplit=1)[0])

    @pytest.fixture
    def launch_options(self) -> dict[str, object]:
        """The ``options`` every launch spec carries (default: none)."""
        return {}

    @pytest.fixture
    def live(
        self,
        adapter: EngineAdapter,
        model: Path,
        launch_options: dict[str, object],
        tmp_path: Path,
    ) -> Iterator[Live]:
        """A live-engine rig; anything it started is killed after the test."""
        rig = Live(self, adapter, model, launch_options, tmp_path)
        try:
            yield rig
        finally:
            rig.close()

    @pytest.fixture
    def spec(self, model: Path, launch_options: dict[str, object], tmp_path: Path) -> LaunchSpec:
        """A launch spec on port 18081 with a work directory."""
        return self.launch_spec(model, 18081, launch_options, work_dir=tmp_path / "work")
