"""The adapter conformance suite against the llama.cpp adapter and the real llama-server."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostler.testing.conformance import AdapterConformance
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_llamacpp import LlamaCppAdapter


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("models") / "tiny.gguf")


class TestLlamaCppConforms(AdapterConformance):
    stop_grace = 2.0

    @pytest.fixture
    def adapter(self) -> LlamaCppAdapter:
        return LlamaCppAdapter()

    @pytest.fixture
    def model(self, tiny: Path) -> Path:
        return tiny
