"""hostler.testing's fake engine under the real supervisor: every scripted behaviour, for real.

Real processes, real HTTP, real signals; the fixtures come from the opt-in pytest plugin.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.error
import urllib.request
from typing import Any

import anyio
import openai
import psutil
import pytest

from hostler import Engine, load
from hostler.engines.supervisor import SupervisorPolicy
from hostler.errors import EngineStartError, UsageError
from hostler.plugin import LaunchSpec, launch_command
from hostler.testing.fake_engine import READY_LINE, Behaviour, FakeEngineAdapter
from hostler.testing.harness import FAST_POLICY, FakeClock, Harness

pytest_plugins = ["hostler.testing.pytest_plugin"]
pytestmark = pytest.mark.anyio
KEY = "fake:m:0"


def post(port: int, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat_body(text: str = "hi") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 1}


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def types_of(harness: Harness) -> list[str]:
    return [r.type for r in harness.store.read_stream(f"engine/{KEY}")]


async def test_a_default_fake_engine_serves_the_openai_api_and_stops(
    hostler_harness: Harness,
) -> None:
    sup = hostler_harness.supervisor(KEY)
    port = await sup.ensure_running()
    pid = sup.pid
    assert pid is not None
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
    reply = await anyio.to_thread.run_sync(
        lambda: client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    )
    assert reply.choices[0].message.content == "hello from the fake engine"
    text = await anyio.to_thread.run_sync(
        lambda: client.completions.create(model="m", prompt="hi", max_tokens=1)
    )
    assert text.choices[0].text == "hello from the fake engine"
    chunks = await anyio.to_thread.run_sync(
        lambda: list(
            client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == (
        "hello from the fake engine"
    )
    models = await anyio.to_thread.run_sync(client.models.list)
    assert [m.id for m in models.data] == ["fake-model"]
    status, native = await anyio.to_thread.run_sync(post, port, "/completion", {"prompt": "x"})
    assert (status, native["content"]) == (200, "hello from the fake engine")
    assert READY_LINE in sup.log_path.read_text()
    await sup.stop()
    assert gone(pid)
    assert types_of(hostler_harness) == [
        "engine.start_requested",
        "engine.spawned",
        "engine.ready",
        "engine.stop_requested",
        "engine.stopped",
    ]
    assert hostler_harness.ledger.snapshot()["by_key"] == []


@pytest.mark.parametrize("fake_behaviour", [Behaviour(load_seconds=1.0)], indirect=True)
async def test_a_slow_load_keeps_the_port_closed_until_ready(hostler_harness: Harness) -> None:
    sup = hostler_harness.supervisor(KEY)
    began = time.monotonic()
    port = await sup.ensure_running()
    assert time.monotonic() - began >= 1.0
    status, _ = await anyio.to_thread.run_sync(post, port, "/v1/chat/completions", chat_body())
    assert status == 200
    await sup.stop()


async def test_listening_while_loading_answers_503_until_loaded(hostler_harness: Harness) -> None:
    hostler_harness.adapters["fake"] = FakeEngineAdapter(
        Behaviour(load_seconds=1.5, listen_while_loading=True)
    )
    sup = hostler_harness.supervisor(KEY)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.ensure_running)
        with anyio.fail_after(10):
            while sup.port is None:
                await anyio.sleep(0.02)
        port = sup.port
        status: int | None = None
        body: dict[str, Any] = {}
        with anyio.fail_after(10):
            while status is None:
                try:
                    status, body = await anyio.to_thread.run_sync(get, port, "/health")
                except OSError:
                    await anyio.sleep(0.02)
        assert (status, body["error"]["message"]) == (503, "Loading model")
        assert sup.state == "starting"
    assert sup.state == "running"
    assert (await anyio.to_thread.run_sync(get, port, "/health"))[0] == 200
    await sup.stop()


@pytest.mark.parametrize(
    "fake_behaviour", [Behaviour(load_seconds=3.0, health_before_ready=True)], indirect=True
)
async def test_health_before_ready_fools_a_status_only_readiness_check(
    hostler_harness: Harness,
) -> None:
    """What ``mlx_lm.server`` does: /health says 200 while completions still answer 503."""
    sup = hostler_harness.supervisor(KEY)
    began = time.monotonic()
    port = await sup.ensure_running()
    assert time.monotonic() - began < 2.5  # declared ready long before the load ends
    status, body = await anyio.to_thread.run_sync(post, port, "/v1/chat/completions", chat_body())
    assert (status, body["error"]["code"]) == (503, 503)
    await sup.stop()


@pytest.mark.parametrize(
    "fake_behaviour", [Behaviour(crash_on_request=2, crash_exit_code=7)], indirect=True
)
async def test_crash_on_request_n_is_recorded_as_a_crash(hostler_harness: Harness) -> None:
    sup = hostler_harness.supervisor(KEY)
    port = await sup.ensure_running()
    assert (await anyio.to_thread.run_sync(post, port, "/v1/completions", {"prompt": "a"}))[
        0
    ] == 200
    with pytest.raises(OSError, match=r"closed|reset|Remote end"):  # the process is gone
        await anyio.to_thread.run_sync(post, port, "/v1/completions", {"prompt": "b"})
    async with anyio.create_task_group() as tg:
        tg.start_soon(sup.watch)
        with anyio.fail_after(10):
            while sup.state == "running":
                await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    crash = [r.event for r in hostler_harness.store.read_stream(f"engine/{KEY}")][-1]
    assert type(crash).__name__ == "EngineCrashed"
    assert getattr(crash, "exit_code") == 7  # noqa: B009
    assert "fake-engine: crashing on request 2" in getattr(crash, "output_tail")  # noqa: B009


@pytest.mark.parametrize("fake_behaviour", [Behaviour(ignore_sigterm=True)], indirect=True)
async def test_an_engine_that_hangs_on_sigterm_is_killed(hostler_harness: Harness) -> None:
    sup = hostler_harness.supervisor(KEY)
    await sup.ensure_running()
    pid = sup.pid
    assert pid is not None
    began = time.monotonic()
    await sup.stop()
    assert time.monotonic() - began >= hostler_harness.policy.stop_grace  # TERM was ignored
    assert gone(pid)
    stopped = [r.event for r in hostler_harness.store.read_stream(f"engine/{KEY}")][-1]
    assert getattr(stopped, "signal") == 9  # noqa: B009


@pytest.mark.parametrize(
    "fake_behaviour",
    [Behaviour(fatal_line="FATAL: out of fake memory", load_seconds=30)],
    indirect=True,
)
async def test_a_fatal_line_aborts_the_start_with_that_line(hostler_harness: Harness) -> None:
    sup = hostler_harness.supervisor(KEY)
    began = time.monotonic()
    with pytest.raises(EngineStartError, match="FATAL: out of fake memory"):
        await sup.ensure_running()
    assert time.monotonic() - began < 15  # not the 30 s load: the line ended it
    engine = load(hostler_harness.store, Engine, KEY)
    assert engine.state == "backoff"
    crash = [r.event for r in hostler_harness.store.read_stream(f"engine/{KEY}")][-1]
    assert getattr(crash, "panic_kind") == "fake-fatal"  # noqa: B009


@pytest.mark.parametrize("fake_behaviour", [Behaviour(exit_code=3)], indirect=True)
async def test_exit_before_ready_says_so(hostler_harness: Harness) -> None:
    sup = hostler_harness.supervisor(KEY)
    with pytest.raises(EngineStartError, match=r"exited \(exit code 3\) before becoming ready"):
        await sup.ensure_running()


async def test_options_script_one_launch_over_the_adapters_behaviour(
    hostler_harness: Harness,
) -> None:
    sup = hostler_harness.supervisor(KEY, options={"reply": "per launch"})
    port = await sup.ensure_running()
    status, body = await anyio.to_thread.run_sync(post, port, "/v1/chat/completions", chat_body())
    assert (status, body["choices"][0]["message"]["content"]) == (200, "per launch")
    await sup.stop()


async def test_the_runtime_fixture_serves_a_request_through_a_fake_engine(
    hostler_runtime: Any, hostler_harness: Harness
) -> None:
    async with hostler_runtime as rt, rt.request(KEY) as port:
        status, _ = await anyio.to_thread.run_sync(post, port, "/v1/chat/completions", chat_body())
        assert status == 200
    assert "engine.ready" in types_of(hostler_harness)


def test_behaviour_json_names_only_what_differs_from_the_defaults() -> None:
    assert Behaviour().to_json() == "{}"
    assert json.loads(Behaviour(crash_on_request=3, reply="x").to_json()) == {
        "crash_on_request": 3,
        "reply": "x",
    }


def test_the_fake_adapter_appends_extras_last_and_binds_loopback(tmp_path: Any) -> None:
    spec = LaunchSpec(
        "fake:m:0",
        tmp_path / "m.bin",
        4321,
        ctx_per_slot=512,
        extra_args={"--a": "1", "--b": True, "--c": False},
    )
    argv = FakeEngineAdapter().build_command(spec).argv
    assert argv[2] == "4321"
    assert argv[-3:] == ["--a", "1", "--b"]
    assert "--c" not in argv
    # it places them itself (applies_extra_args), so hostler's launch has them once
    assert launch_command(FakeEngineAdapter(), spec).argv == argv


def test_fake_clock_moves_only_forward_when_told() -> None:
    clock = FakeClock(100.0)
    assert clock() == 100.0
    assert clock.advance(2.5) == 102.5
    assert clock.advance(0) == 102.5
    clock.set(200.0)
    assert clock() == 200.0
    with pytest.raises(UsageError, match="does not go back"):
        clock.advance(-0.001)
    assert clock() == 200.0
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(UsageError, match="a finite number of seconds"):
            clock.advance(bad)
        with pytest.raises(UsageError, match="a finite number of seconds"):
            clock.set(bad)
        with pytest.raises(UsageError, match="starts at a finite time"):
            FakeClock(bad)
    late = FakeClock(1e308)
    with pytest.raises(UsageError, match="a finite number of seconds"):
        late.advance(1e308)  # finite, but the reading would not be
    assert late() == 1e308
    assert clock() == 200.0


class TestTheFakeClockDrivesTheIdleTimer:
    """A harness on ``fake_clock``: the supervisor's idle stop waits for the clock, not time."""

    @pytest.fixture
    def hostler_clock(self, fake_clock: FakeClock) -> FakeClock:
        return fake_clock

    @pytest.fixture
    def hostler_policy(self) -> SupervisorPolicy:
        return dataclasses.replace(FAST_POLICY, idle_timeout=300)

    async def test_idle_stop_at_the_timeout_by_the_clock(
        self, hostler_harness: Harness, fake_clock: FakeClock
    ) -> None:
        sup = hostler_harness.supervisor(KEY)
        await sup.ensure_running()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sup.watch)
            fake_clock.advance(299)
            await anyio.sleep(0.5)  # ten watch ticks: not idle for 300 s yet
            assert sup.state == "running"
            fake_clock.advance(1)  # unused for exactly 300 s: idle (SP4)
            with anyio.fail_after(10):
                while sup.state != "stopped":
                    await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        assert load(hostler_harness.store, Engine, KEY).stop_reason == "idle"


@pytest.mark.parametrize(
    "move",
    [
        lambda clock: clock.set(float("nan")),
        lambda clock: clock.advance(float("nan")),
        lambda clock: clock.advance(float("inf")),
    ],
    ids=["set-nan", "advance-nan", "advance-inf"],
)
def test_the_fake_clock_refuses_a_time_that_is_not_a_time(move: object) -> None:
    """FakeClock takes finite times only: NaN or infinity raise UsageError, like a step back.

    testing.md: "It never goes back: a negative step raises UsageError". Today
    FakeClock.set / advance (hostler.testing.harness) compare with `<`, which NaN passes,
    so `clock.set(nan)` is accepted and the clock reads NaN from then on (every idle and
    health decision under it then compares false); `advance(inf)` is accepted too.
    """
    from hostler.errors import UsageError
    from hostler.testing.harness import FakeClock

    clock = FakeClock()
    with pytest.raises(UsageError):
        move(clock)  # type: ignore[operator]
    assert clock() == 1_800_000_000.0
