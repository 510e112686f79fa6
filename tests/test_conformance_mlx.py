"""The adapter conformance suite against the MLX adapter and the real ``mlx_lm.server``."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostler.testing.conformance import AdapterConformance
from hostler.testing.tiny_mlx import write_tiny_mlx
from hostler_mlx import MlxAdapter

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mlx(tmp_path_factory.mktemp("models") / "tiny-mlx")


class TestMlxConforms(AdapterConformance):
    stop_grace = 2.0

    @pytest.fixture
    def adapter(self) -> MlxAdapter:
        return MlxAdapter()

    @pytest.fixture
    def model(self, tiny: Path) -> Path:
        return tiny
