"""GA8/I4: an image job on sd-cpp holds the ``image`` lease for its whole render under ``swap``.

A real ``llama-server`` chat engine (a tiny generated GGUF) and the fake ``sd-server`` (a real
process speaking sd-server's flags and endpoints, ``tests/_fake_sdserver.py``) run under one
runtime, real supervisor, ledger and log, with the GPU arbiter in ``swap`` mode. A slow image
job starts; a chat request is sent while it renders. The image engine is never stopped during
the render; the chat waits for the render to end, then runs; and once the card is the chat's,
the idle image engine is unloaded for it (GA1, under its own ``image`` slot).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import anyio
import pytest

import hostler
from _rigs import LlamaRig
from hostler import EventStore
from hostler.cli.ps import ps_rows
from hostler.engines.price import LaunchRequest, price_from_ledger
from hostler.engines.supervisor import Supervisor, SupervisorPolicy
from hostler.plugin import LaunchSpec
from hostler.runtime.arbiter import GpuArbiter
from hostler_sdcpp import SdCppAdapter

from _fake_sdserver import shim

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

CHAT = "llamacpp:chat:0"
IMAGE = "sdcpp:sd:0"
#: How long the fake renders one image (4 steps).
RENDER = 3.0


class Rig(LlamaRig):
    """A tiny chat model on llama-server and an image model on the fake sd-server."""

    def __init__(self, tmp_path: Path, store: EventStore) -> None:
        super().__init__(tmp_path, store, ["chat"])
        self.sd = SdCppAdapter()
        self.sd_binary = shim(tmp_path / "bin")
        self.sd_model = tmp_path / "sd-turbo.safetensors"
        self.sd_model.write_bytes(b"\0" * 4096)

    def sd_spec(self, port: int) -> LaunchSpec:
        return LaunchSpec(
            IMAGE,
            self.sd_model,
            port,
            ctx_per_slot=512,
            options={"steps": 4},
            extra_args={"--fake-seconds-per-image": RENDER},
            binary=self.sd_binary,
        )

    def price(self, key: str) -> int:
        if key != IMAGE:
            return super().price(key)
        priced = price_from_ledger(
            self.sd,
            self.ledger,
            LaunchRequest(key=key, model=self.sd_model, ctx=512, slots=1, kv_type=None),
        ).price
        return int(priced.reserved_bytes)

    def build(self, key: str) -> Supervisor:
        if key != IMAGE:
            return super().build(key)
        return Supervisor(
            key,
            self.sd,
            self.sd_spec,
            self.store,
            run_dir=self.tmp_path / "run" / "sd",
            token_prefix=self.token,
            policy=SupervisorPolicy(watch_interval=0.05, idle_timeout=0),
            ledger=self.ledger,
            footprint=lambda: self.price(key),
        )

    def swap_runtime(self, policy: str = "swap") -> hostler.Runtime:
        return hostler.Runtime(
            self.store,
            self.build,
            ledger=self.ledger,
            drain_poll=0.05,
            drain_wait=30,
            arbiter=GpuArbiter(policy, store=self.store),
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with EventStore.open(tmp_path / "events.db") as store:
        yield Rig(tmp_path, store)


def post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def chat(port: int) -> str:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    return str(post(port, "/v1/chat/completions", body)["choices"][0]["finish_reason"])


def engine_events(store: EventStore, key: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (r.type, dict(r.payload))
        for r in store.read_all()
        if r.stream_id == f"engine/{key}" and r.type.startswith("engine.")
    ]


async def test_a_chat_waits_for_a_render_and_never_evicts_it(rig: Rig) -> None:
    marks: dict[str, float] = {}
    seen: list[tuple[int, int]] = []
    shown: set[str] = set()
    rendering = anyio.Event()
    async with rig.swap_runtime() as rt:
        # the chat engine is warm first: the image lease takes the card from it (GA1)
        async with rt.request(CHAT) as port:
            assert await anyio.to_thread.run_sync(chat, port) in {"length", "stop"}
        assert rt.arbiter.evictors() == {"llm": [CHAT]}

        async def render() -> None:
            async with rt.request(IMAGE) as port:
                assert [row["slot"] for row in rt.arbiter.leases()] == ["image"]
                sd = rt.pool.supervisor(IMAGE)
                pid = sd.pid
                marks["render_start"] = time.monotonic()
                rendering.set()
                body = {"prompt": "a lighthouse", "width": 512, "height": 512, "steps": 4}
                answers: list[dict[str, Any]] = []
                async with anyio.create_task_group() as inner:

                    async def send() -> None:
                        got = await anyio.to_thread.run_sync(post, port, "/sdapi/v1/txt2img", body)
                        answers.append(got)
                        inner.cancel_scope.cancel()

                    inner.start_soon(send)
                    while True:  # PG1: the render's progress, as `hostler ps` shows it
                        view = next(v for v in rt.pool.snapshot() if v.key == IMAGE)
                        if view.progress is not None:
                            seen.append((view.progress.done, view.progress.total))
                            shown.add(ps_rows({"engines": [asdict(view)]}, {})[0][2])
                        await anyio.sleep(0.05)
                answer = answers[0]
                marks["render_end"] = time.monotonic()
                assert len(answer["images"]) == 1
                # still the same running process, never stopped while it rendered
                assert (sd.state, sd.pid) == ("running", pid)
                marks["stops_at_render_end"] = sum(
                    kind == "engine.stop_requested" for kind, _ in engine_events(rig.store, IMAGE)
                )
                assert "chat_enter" not in marks  # the chat has not run meanwhile

        async def ask() -> None:
            await rendering.wait()
            await anyio.sleep(0.3)  # well inside the render
            marks["chat_sent"] = time.monotonic()
            async with rt.request(CHAT) as port:
                marks["chat_enter"] = time.monotonic()
                assert await anyio.to_thread.run_sync(chat, port) in {"length", "stop"}
                marks["chat_done"] = time.monotonic()

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(render)
                tg.start_soon(ask)
        assert rt.arbiter.evictors() == {"image": [IMAGE], "llm": [CHAT]}
        assert rt.arbiter.leases() == []  # the lease was released after the render
        # PG1: the render's steps were seen rising while it ran, and are gone once it is over
        assert seen, "no progress was shown during a 3 s render"
        assert {total for _, total in seen} == {4}
        assert [done for done, _ in seen] == sorted(done for done, _ in seen)
        assert len({done for done, _ in seen}) >= 2
        assert shown <= {f"running {done}/4 step" for done in range(1, 5)}
        assert all(v.progress is None for v in rt.pool.snapshot())

    assert marks["stops_at_render_end"] == 0  # GA8/I4: not evicted, not stopped mid-image
    waited = marks["chat_enter"] - marks["chat_sent"]
    assert marks["chat_enter"] >= marks["render_end"]  # the chat waited for the render...
    assert waited >= RENDER - 0.3 - 0.5  # ...most of its length (measured)
    assert marks["chat_done"] >= marks["chat_enter"]  # ...then ran
    # once the chat took the card, the idle image engine went for it under its own slot (GA1)
    stops = [p for kind, p in engine_events(rig.store, IMAGE) if kind == "engine.stop_requested"]
    assert stops[0]["reason"] == "evicted"
    assert stops[0]["decision"]["rule"] == "GA1"
    assert stops[0]["decision"]["slot"] == "image"
    leases = [r.type for r in rig.store.read_all() if r.stream_id.startswith("lease/")]
    assert leases == ["lease.requested", "lease.granted", "lease.released"]
    print(f"chat waited {waited:.2f} s behind a {RENDER:.1f} s render")


async def test_a_cancelled_render_gives_the_lease_back(rig: Rig) -> None:
    async with rig.swap_runtime() as rt:
        started = anyio.Event()

        async def render() -> None:
            async with rt.request(IMAGE) as port:
                started.set()
                body = {"prompt": "x", "width": 512, "height": 512}
                await anyio.to_thread.run_sync(
                    post, port, "/sdapi/v1/txt2img", body, abandon_on_cancel=True
                )

        async with anyio.create_task_group() as tg:
            tg.start_soon(render)
            with anyio.fail_after(60):
                await started.wait()
            assert [row["slot"] for row in rt.arbiter.leases()] == ["image"]
            tg.cancel_scope.cancel()  # the client went away mid-render
        assert rt.arbiter.leases() == []  # released, shielded from the cancellation (GA8)
        with anyio.fail_after(60):
            async with rt.request(CHAT) as port:  # so a chat is not held behind it
                assert await anyio.to_thread.run_sync(chat, port) in {"length", "stop"}
    leases = [r.type for r in rig.store.read_all() if r.stream_id.startswith("lease/")]
    assert leases == ["lease.requested", "lease.granted", "lease.released"]


async def test_under_coexist_a_chat_runs_beside_a_render(rig: Rig) -> None:
    marks: dict[str, float] = {}
    async with rig.swap_runtime("coexist") as rt:
        async with rt.request(CHAT) as port:  # warm, so the chat below is quick
            await anyio.to_thread.run_sync(chat, port)
        rendering = anyio.Event()

        async def render() -> None:
            async with rt.request(IMAGE) as port:
                assert rt.arbiter.leases() == []  # coexist: no lease is taken
                rendering.set()
                body = {"prompt": "x", "width": 512, "height": 512}
                await anyio.to_thread.run_sync(post, port, "/sdapi/v1/txt2img", body)
                marks["render_end"] = time.monotonic()

        async def ask() -> None:
            await rendering.wait()
            async with rt.request(CHAT) as port:
                await anyio.to_thread.run_sync(chat, port)
                marks["chat_done"] = time.monotonic()

        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(render)
                tg.start_soon(ask)
    assert marks["chat_done"] < marks["render_end"]  # nothing waited for the render
    assert not [r for r in rig.store.read_all() if r.stream_id.startswith("lease/")]
