"""The adapter conformance suite against the sd-cpp adapter, launching the fake ``sd-server``.

The fake is a real process speaking sd-server's flags and endpoints (``tests/_fake_sdserver.py``);
the real server is checked in the opt-in ``sdcpp-real`` tox env (tests/test_sdcpp_real.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hostler.plugin import LaunchSpec
from hostler.testing.conformance import AdapterConformance
from hostler_sdcpp import SdCppAdapter

from _fake_sdserver import shim


class TestSdCppConforms(AdapterConformance):
    serves_completions = False  # an image server: no chat completions
    stop_grace = 2.0
    startup_timeout = 30.0

    @pytest.fixture(autouse=True)
    def _binary(self, tmp_path: Path) -> None:
        self.binary = shim(tmp_path / "bin")

    @pytest.fixture
    def adapter(self) -> SdCppAdapter:
        return SdCppAdapter()

    @pytest.fixture
    def model(self, tmp_path: Path) -> Path:
        path = tmp_path / "sd-turbo.safetensors"
        path.write_bytes(b"\0" * 4096)
        return path

    def launch_spec(
        self, model: Path, port: int, options: dict[str, object], **changes: Any
    ) -> LaunchSpec:
        """The suite's spec, running the fake sd-server as the configured binary."""
        spec = super().launch_spec(model, port, options, **changes)
        return replace(spec, binary=self.binary)
