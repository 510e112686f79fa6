"""hostler-echo's tests: hostler's conformance suite, and the engine under a real runtime."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from hostler import Runtime
from hostler.plugin import EngineAdapter, ModelFileError
from hostler.testing.conformance import AdapterConformance
from hostler_echo import EchoAdapter


class TestEchoConformance(AdapterConformance):
    """Every check of the adapter contract, live ones included, against EchoAdapter."""

    @pytest.fixture
    def adapter(self) -> EchoAdapter:
        """The adapter under test."""
        return EchoAdapter()

    @pytest.fixture
    def model(self, tmp_path: Path) -> Path:
        """A tiny echo model: its first line starts every answer."""
        path = tmp_path / "parrot.txt"
        path.write_text("Polly says\n")
        return path


class TestEchoSlowLoad(TestEchoConformance):
    """The same checks while the model takes half a second to load: readiness must wait."""

    @pytest.fixture
    def launch_options(self) -> dict[str, object]:
        """The options of every launch: a slow load (options_schema declares it)."""
        return {"load_seconds": 0.5}


@pytest.fixture
def hostler_adapters() -> dict[str, EngineAdapter]:
    """The pytest plugin's runtime runs our engine instead of its fake one."""
    return {"echo": EchoAdapter()}


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio, through anyio's pytest plugin (installed with hostler)."""
    return "asyncio"


@pytest.mark.anyio
async def test_the_runtime_starts_it_on_demand_and_it_answers(
    hostler_runtime: Runtime,
) -> None:
    """A request through hostler's runtime starts the engine and reaches it."""
    async with hostler_runtime as rt, rt.request("echo:parrot:0") as port:
        body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
    # the harness's placeholder model reads "fake weights": the first line is the prefix
    assert answer.json()["choices"][0]["message"]["content"] == "fake weights hello"


def test_an_unreadable_model_is_refused_in_one_line(tmp_path: Path) -> None:
    """A model that is not there is refused as hostler expects: ModelFileError."""
    with pytest.raises(ModelFileError, match="no such model file"):
        EchoAdapter().validate_model(tmp_path / "missing.txt")
