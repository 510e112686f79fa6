"""The adapter conformance suite against the fake engine's adapter (a real process)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from hostler.testing import fake_engine
from hostler.testing.conformance import AdapterConformance
from hostler.testing.fake_engine import FakeEngineAdapter


class TestFakeEngineConforms(AdapterConformance):
    stop_grace = 1.0

    @pytest.fixture
    def adapter(self) -> FakeEngineAdapter:
        return FakeEngineAdapter()

    @pytest.fixture
    def model(self, tmp_path: Path) -> Path:
        path = tmp_path / "weights.bin"
        path.write_bytes(b"\0" * 4096)
        return path

    @pytest.fixture
    def plugin_module(self) -> ModuleType:
        return fake_engine
