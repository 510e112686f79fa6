"""The sd-cpp adapter against a real ``sd-server`` (opt-in: ``tox -e sdcpp-real``).

Collected only when ``$HOSTLER_SD_SERVER`` names the binary (tests/conftest.py); the tox env
builds it from the ``stable-diffusion-cpp-python`` sdist (bench/build_sd_server.py). Without
a model the real server still proves the launch facts: it refuses ``--host/--port`` (IN41)
and an unreadable model fails the start at once on its fatal line, through the real
supervisor. With ``$HOSTLER_SD_MODEL`` naming a model, it also renders through the runtime
under ``swap`` and passes the conformance suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import pytest

from hostler import EventStore
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.errors import EngineStartError
from hostler.plugin import LaunchSpec
from hostler.testing.conformance import AdapterConformance
from hostler_sdcpp import SdCppAdapter
from hostler_sdcpp.binary import find_sd_server
from hostler_sdcpp.logs import classify_line

BINARY = find_sd_server()
MODEL = os.environ.get("HOSTLER_SD_MODEL")


def test_the_real_server_refuses_host_and_port(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BINARY), "--host", "127.0.0.1", "--port", "18555", "--model", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    kinds = {
        p.kind for line in (done.stdout + done.stderr).splitlines() if (p := classify_line(line))
    }
    assert kinds == {"bad-arguments"}


def test_our_argv_is_taken_and_a_junk_model_fails_the_start_at_once(tmp_path: Path) -> None:
    model = tmp_path / "junk.safetensors"
    model.write_bytes(b"\0" * 4096)

    async def start() -> float:
        with EventStore.open(tmp_path / "events.db", owner=True) as store:
            sup = Supervisor(
                "sdcpp:junk:0",
                SdCppAdapter(),
                lambda port: LaunchSpec("sdcpp:junk:0", model, port, ctx_per_slot=512),
                store,
                run_dir=tmp_path / "run",
                token_prefix=f"sdreal-{os.getpid()}",
                policy=SupervisorPolicy(startup_timeout=300, watch_interval=0.05, idle_timeout=0),
            )
            began = time.monotonic()
            with pytest.raises(EngineStartError) as caught:
                await sup.ensure_running()
            assert "model" in str(caught.value) or "new_sd_ctx_t" in str(caught.value)
            return time.monotonic() - began

    took = anyio.run(start)
    assert took < 60  # the fatal line (or the exit) ends the wait, not the 300 s timeout


def post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=1800) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


if MODEL:  # a model is named: render for real, and the conformance suite

    class TestRealSdServerConforms(AdapterConformance):
        serves_completions = False
        startup_timeout = 300.0
        stop_grace = 5.0

        @pytest.fixture
        def adapter(self) -> SdCppAdapter:
            return SdCppAdapter()

        @pytest.fixture
        def model(self) -> Path:
            return Path(str(MODEL))

    def test_a_real_render_through_the_supervisor(tmp_path: Path) -> None:
        async def render() -> int:
            with EventStore.open(tmp_path / "events.db", owner=True) as store:
                sup = Supervisor(
                    "sdcpp:real:0",
                    SdCppAdapter(),
                    lambda port: LaunchSpec(
                        "sdcpp:real:0", Path(str(MODEL)), port, ctx_per_slot=512
                    ),
                    store,
                    run_dir=tmp_path / "run",
                    token_prefix=f"sdreal-{os.getpid()}",
                    policy=SupervisorPolicy(
                        startup_timeout=300, watch_interval=0.05, idle_timeout=0
                    ),
                )
                port = await sup.ensure_running()
                try:
                    body = {"prompt": "a red square", "width": 64, "height": 64, "steps": 1}
                    answer = await anyio.to_thread.run_sync(post, port, "/sdapi/v1/txt2img", body)
                    return len(answer["images"])
                finally:
                    await sup.stop()

        assert anyio.run(render) == 1
