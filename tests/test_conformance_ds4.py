"""The adapter conformance suite against the ds4 adapter, launching the fake ``ds4-server``.

No installable ds4 build exists: the fake (``python -m hostler_ds4.fake_server``, installed as an
executable ``ds4-server`` beside a ``shaders/`` folder) is a real process with ds4's flags,
endpoints, lock file and failure modes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hostler.testing.conformance import AdapterConformance
from hostler.testing.tiny_gguf import write_tiny_llama
from hostler_ds4 import Ds4Adapter
from test_ds4_adapter import GIB, install_fake


class TestDs4Conforms(AdapterConformance):
    stop_grace = 2.0
    startup_timeout = 30.0

    @pytest.fixture(autouse=True)
    def _lock(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """This test's machine-wide ds4 lock (children inherit the variable)."""
        monkeypatch.setenv("DS4_SERVER_LOCK", str(tmp_path / "ds4-server.lock"))
        # a stream that lasts (0.2 s a word): the busy checks ask while one runs
        monkeypatch.setenv("FAKE_DS4_WORD_SECONDS", "0.2")

    @pytest.fixture
    def adapter(self, tmp_path: Path) -> Ds4Adapter:
        binary = install_fake(tmp_path / "ds4")
        return Ds4Adapter(
            binary, system_ram=128 * GIB, machine="x86_64", system="Linux", environ={}
        )

    @pytest.fixture
    def model(self, tmp_path: Path) -> Path:
        return write_tiny_llama(tmp_path / "flash.gguf")
