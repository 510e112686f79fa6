"""The adapter conformance suite against the fake engine's adapter (a real process)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from hostler.testing import fake_engine
from hostler.testing.conformance import AdapterConformance
from hostler.testing.fake_engine import Behaviour, FakeEngineAdapter


class TestFakeEngineConforms(AdapterConformance):
    stop_grace = 1.0

    @pytest.fixture
    def adapter(self) -> FakeEngineAdapter:
        # its streams last half a second: the busy checks ask while one runs
        return FakeEngineAdapter(Behaviour(stream_seconds=0.5))

    @pytest.fixture
    def model(self, tmp_path: Path) -> Path:
        path = tmp_path / "weights.bin"
        path.write_bytes(b"\0" * 4096)
        return path

    @pytest.fixture
    def plugin_module(self) -> ModuleType:
        return fake_engine
